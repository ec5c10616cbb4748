"""Fast kernels shared by vendor plugins."""
