"""The baseline of benchmarks/serve_load.py: sentence-transformers behind the simplest FastAPI
endpoint a user would write (one request = one ``encode`` call, FastAPI's thread pool).

    python benchmarks/st_server.py --port 8001
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

import layerwise as lw

model = SentenceTransformer(str(lw.default_model_path()), device="cpu")
app = FastAPI()


class Body(BaseModel):
    input: list[str]
    encoding_format: str = "float"


@app.get("/health")
def health() -> dict:
    return {"status": "ok"}


@app.post("/v1/embeddings")
def embeddings(body: Body) -> dict:
    vectors = model.encode(body.input)
    return {"data": [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8001)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning")
