"""Remote workers on Ray (``remote=stoker.ray_workers(n)``): what is asked for and the body
of one actor (actor), and the loader's side that sends chunks to the actors (pool)."""
