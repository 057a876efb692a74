"""Executors: where map and reduce tasks run (in-process, a process pool, Ray) and what each task cost
(CPU, wall, peak memory), summed into the job's phase profile. The export job and the converters
both run on them; they know nothing of stores, windows or shards."""
