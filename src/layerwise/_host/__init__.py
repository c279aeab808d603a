"""What the process does on its host: give free memory back, and show progress."""
