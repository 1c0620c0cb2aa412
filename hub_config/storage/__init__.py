"""gpulab's own database: one engine module, one time type, the schema's migrations."""
