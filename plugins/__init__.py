"""jobprof's built-in plugins, one subpackage per data type, each registered as an entry point."""
