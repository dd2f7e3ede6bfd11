"""Data tables (per-SKU performance, ...): plain data, no logic beyond lookups."""
