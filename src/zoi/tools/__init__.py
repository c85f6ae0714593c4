"""User tools beside the CLI (`zoi eval`): they build on the engine and the quantiser."""
