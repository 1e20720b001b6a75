"""Make the checkout importable as ansible_collections.dgxspark.vllm for plain pytest runs.

ansible-test does this itself; plain `pytest tests/unit` gets a throw-away ansible_collections tree whose
dgxspark/vllm entry links back to this checkout.
"""
import os
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_parts = _ROOT.split(os.sep)
if _parts[-3:-2] != ["ansible_collections"]:
    _tree = tempfile.mkdtemp(prefix="dgxspark-collections-")
    os.makedirs(os.path.join(_tree, "ansible_collections", "dgxspark"))
    os.symlink(_ROOT, os.path.join(_tree, "ansible_collections", "dgxspark", "vllm"))
    sys.path.insert(0, _tree)
else:
    sys.path.insert(0, os.sep.join(_parts[:-3]))

# tests/unit itself, for the shared helpers package
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
