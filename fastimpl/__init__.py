"""fastimpl: the product library (issue 3)."""
