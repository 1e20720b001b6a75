# Offline stand-in for pip's get-pip.py, used by ansible-test when it builds its sanity venvs:
# bootstrap pip with ensurepip, then install the pip version ansible-test asks for from the package index.
import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
if args:
    subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
