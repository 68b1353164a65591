"""The fake MLX package of the mlx adapter tests (see core.py)."""
