"""The profile folder and its formats: safe writes, the PROF_ layout, the raw store, the
per-iteration export and the timeline files it renders."""
