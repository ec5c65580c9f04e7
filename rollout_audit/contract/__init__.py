"""The log contract: column schema, pandera models, configuration and the rule registry; imports nothing above it."""
