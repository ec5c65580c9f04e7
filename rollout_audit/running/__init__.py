"""Running the checks: runner, engine, executors, options, the report's data, memory and progress;
imports contract, reading, frames, replay and checks."""
