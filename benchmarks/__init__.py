"""Benchmark harness for rollout-audit: a vectorised generator of large compliant logs
(`python -m benchmarks.generate`) and the speed/memory benchmark (`python -m benchmarks.run`)."""
