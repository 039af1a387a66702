"""Remote workers on Ray (``remote=stoker.ray_workers(n)``): pool.py."""
