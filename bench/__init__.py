"""simsearch benchmarks, built like ann-benchmarks: adapters, YAML configs, raw JSON results,
derived tables and plots. Run ``python -m bench --help`` from the repository root."""
