"""The engine: what drives the plugin contract, private to jobprof (plugins never import it).

* :mod:`~jobprof.engine.manager`: the :class:`PluginManager` (pluggy's, with entry-point
  loading, per-plugin isolation, the contract's checks of what hooks return);
* :mod:`~jobprof.engine.options`: ``PROFILING_OPTIONS`` parsed and validated against the
  plugins' JSON Schemas (:mod:`~jobprof.engine.schemacheck` explains a failure);
* :mod:`~jobprof.engine.configure`: the options, the plugins and the frozen ``Config`` together;
* :mod:`~jobprof.engine.moved`: the old module paths, kept for plugins written against them.

The contract itself (hooks, values, records, results) is :mod:`jobprof.plugin`.
"""
