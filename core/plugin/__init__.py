"""The plugin framework: the hook contract (hookspec), its values and declared records (types),
the pluggy manager that loads and isolates plugins, and the options they configure from."""
