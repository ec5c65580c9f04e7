"""Running the checks: runner, engine, executors, memory and progress; imports contract, reading, frames and checks."""
