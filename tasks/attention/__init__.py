# Lets pytest tell the per-task test_reference.py modules apart.
