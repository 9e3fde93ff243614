"""Coverage-guided fuzz targets (``targets.py``) and their regression corpus (``corpus/``)."""
