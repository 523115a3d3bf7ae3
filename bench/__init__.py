"""loopfence benchmarks against the frameworks people would pick instead. Entry point: bench/run.py."""
