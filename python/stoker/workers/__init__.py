"""Worker processes and what they run, on the Python side: starting and reaping them
(processes), a worker process's loop (main), the jobs of the batch path and of streams (jobs),
the start-up every kind of worker shares (startup) and the shared-memory arenas whole batches
come back in (arena). The engine's worker threads are C++ (src/); Ray actors are in
stoker/remote/."""
