# Copyright: Contributors to the dgxspark.vllm collection
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run several ``vllm bench serve`` cases with one import of vLLM (playbooks/benchmark.yml).

Runs inside the head's serve container, fed on stdin to the container's own Python (``python3 -``), with one
argument: the plan as JSON (dgxspark.vllm.vllm_benchmark_plan builds it)::

    {"result_dir": "/tmp/dgxspark-bench-123", "case_timeout": 900, "base_url": "http://127.0.0.1:8000",
     "model": "glm-5.3-flash", "resolve_tokenizer": true,
     "cases": [{"name": "decode", "argv": ["vllm", "bench", "serve", "--backend", "vllm", ...]}, ...]}

It does for each case what ``vllm bench serve ARGS`` does (vllm/entrypoints/cli/main.py and
entrypoints/cli/benchmark/serve.py): build the parser with ``vllm.benchmarks.serve.add_cli_args`` on vLLM's
``FlexibleArgumentParser``, parse the case's arguments, and run ``vllm.benchmarks.serve.main`` (its coroutine
``main_async``, under the case's time budget). vLLM is imported once, not once per case (each CLI start
imports it again, about 30 s in the lab). Then it prints the result file each case saved, as one JSON line
after the word DGXSPARK-BENCH-RESULTS (with ``elapsed_s``, the seconds the whole run took, vLLM's
import included), and removes its result folder.

The API key never appears on an argv: vLLM's client sends ``OPENAI_API_KEY`` (set from the container's
``VLLM_API_KEY`` by the shell that starts this program). With ``resolve_tokenizer``, the tokenizer is the path
the server itself loaded (``root`` of the served model in ``/v1/models``).

Standard library and vLLM only. Exit status: 0 every case ran, 1 a case failed, 2 a bad plan.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import shutil
import sys
import time
import traceback
import urllib.request

MARKER = "DGXSPARK-BENCH-RESULTS"
PREFIX = ["vllm", "bench", "serve"]
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# flags that could carry a secret or write outside the result folder: the plan never sets them
REFUSED = ("--header", "--append-result", "--plot-timeline", "--plot-dataset-stats", "--profile")


class PlanError(ValueError):
    """The plan is not one this driver runs."""


def option(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in argv (``--name value`` or ``--name=value``); None when absent."""
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1:]
    return None


def load_plan(args: list[str]) -> dict:
    """The plan from the command line, checked: every case is ``vllm bench serve`` saving
    ``<result_dir>/<name>.json``, with names unique and no refused flag."""
    if len(args) != 1:
        raise PlanError(f"expected one argument (the plan as JSON), got {len(args)}")
    try:
        plan = json.loads(args[0])
    except ValueError as exc:
        raise PlanError(f"the plan is not JSON: {exc}") from exc
    if not isinstance(plan, dict):
        raise PlanError("the plan must be a JSON object")
    for key in ("result_dir", "case_timeout", "base_url", "model", "cases"):
        if key not in plan:
            raise PlanError(f"the plan has no {key!r}")
    result_dir = plan["result_dir"]
    if not isinstance(result_dir, str) or not result_dir.startswith("/") or result_dir.rstrip("/") == "":
        raise PlanError(f"result_dir must be an absolute directory other than /, got {result_dir!r}")
    timeout = plan["case_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise PlanError(f"case_timeout must be a positive integer, got {timeout!r}")
    cases = plan["cases"]
    if not isinstance(cases, list) or not cases:
        raise PlanError("the plan has no cases")
    seen = set()
    for case in cases:
        name = case.get("name") if isinstance(case, dict) else None
        argv = case.get("argv") if isinstance(case, dict) else None
        if not isinstance(name, str) or not NAME_RE.match(name) or name in seen:
            raise PlanError(f"bad or repeated case name {name!r}")
        seen.add(name)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or argv[:3] != PREFIX:
            raise PlanError(f"case {name}: the argv must be a list of strings starting with 'vllm bench serve'")
        refused = [a for a in argv if a.split("=", 1)[0] in REFUSED]
        if refused:
            raise PlanError(f"case {name}: refused option(s) {refused}")
        if option(argv, "--result-dir") != result_dir or option(argv, "--result-filename") != name + ".json":
            raise PlanError(f"case {name}: it must save {result_dir}/{name}.json "
                            "(--save-result --result-dir --result-filename)")
        if "--save-result" not in argv:
            raise PlanError(f"case {name}: --save-result is missing")
    return plan


def bypass_proxy_for_loopback(environ: dict) -> None:
    """vLLM's client honours the proxy variables (aiohttp trust_env): keep loopback off any proxy."""
    for var in ("no_proxy", "NO_PROXY"):
        hosts = [h for h in environ.get(var, "").split(",") if h.strip()]
        for host in ("127.0.0.1", "localhost", "::1"):
            if host not in hosts:
                hosts.append(host)
        environ[var] = ",".join(hosts)


def served_root(base_url: str, model: str, api_key: str | None, timeout: float = 30.0) -> str:
    """The path the server loaded for ``model``: ``root`` of its entry in ``/v1/models``."""
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models")
    if api_key:
        request.add_header("Authorization", "Bearer " + api_key)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout) as response:
        listing = json.loads(response.read().decode("utf-8"))
    for entry in listing.get("data") or []:
        if entry.get("id") == model and entry.get("root"):
            return str(entry["root"])
    names = [entry.get("id") for entry in listing.get("data") or []]
    raise PlanError(f"the server serves no model {model!r} with a root path (it serves {names})")


def with_tokenizer(argv: list[str], tokenizer: str | None) -> list[str]:
    """argv with ``--tokenizer`` added when it has none and one is known."""
    if tokenizer is None or option(argv, "--tokenizer") is not None:
        return list(argv)
    return list(argv) + ["--tokenizer", tokenizer]


class Vllm:
    """What the driver uses of vLLM, imported once."""

    def __init__(self) -> None:
        self.serve = importlib.import_module("vllm.benchmarks.serve")
        try:
            parsers = importlib.import_module("vllm.utils.argparse_utils")
        except ImportError:  # vLLM before the argparse helpers moved (about 0.11)
            parsers = importlib.import_module("vllm.utils")
        self.parser_class = parsers.FlexibleArgumentParser
        self.version = getattr(importlib.import_module("vllm"), "__version__", None)
        # as `vllm bench ...` does: an unspecified platform becomes the CPU platform
        platforms = importlib.import_module("vllm.platforms")
        if platforms.current_platform.is_unspecified():
            platforms.current_platform = importlib.import_module("vllm.platforms.cpu").CpuPlatform()
        logger = importlib.import_module("vllm.logger")
        self.configure_logging = getattr(logger, "configure_logging_from_args", None)

    def parse(self, argv: list[str]):
        parser = self.parser_class(prog="vllm bench serve")
        self.serve.add_cli_args(parser)
        args = parser.parse_args(argv[len(PREFIX):])
        if self.configure_logging is not None:
            self.configure_logging(args)
        return args

    def run(self, args, timeout: int) -> None:
        main_async = getattr(self.serve, "main_async", None)
        if main_async is None:  # no coroutine to bound: run it as the CLI does
            self.serve.main(args)
            return
        asyncio.run(asyncio.wait_for(main_async(args), timeout))


def run_cases(plan: dict, vllm, environ: dict) -> dict:
    """Run every case in order; stop at the first that fails. Returns the results document."""
    doc: dict = {"vllm_version": getattr(vllm, "version", None), "tokenizer": None, "results": {}, "errors": {}}
    tokenizer = None
    if plan.get("resolve_tokenizer"):
        try:
            tokenizer = served_root(plan["base_url"], plan["model"], environ.get("OPENAI_API_KEY"))
        except (OSError, ValueError) as exc:
            doc["errors"]["tokenizer"] = f"cannot read the served model's path from {plan['base_url']}/v1/models: {exc}"
            return doc
    doc["tokenizer"] = tokenizer
    os.makedirs(plan["result_dir"], exist_ok=True)
    for case in plan["cases"]:
        name = case["name"]
        path = os.path.join(plan["result_dir"], name + ".json")
        if os.path.exists(path):
            os.remove(path)
        print(f"===== {name}: {' '.join(with_tokenizer(case['argv'], tokenizer))}", flush=True)
        try:
            vllm.run(vllm.parse(with_tokenizer(case["argv"], tokenizer)), plan["case_timeout"])
            with open(path, encoding="utf-8") as handle:
                doc["results"][name] = json.load(handle)
        except asyncio.TimeoutError:
            doc["errors"][name] = f"not finished within {plan['case_timeout']} s (benchmark_timeout)"
        except SystemExit as exc:  # argparse refused the arguments
            doc["errors"][name] = f"vllm bench serve refused the arguments (exit {exc.code})"
        except Exception as exc:  # pylint: disable=broad-exception-caught  # report any failure of vLLM's run
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            doc["errors"][name] = last[:1000]
            traceback.print_exc()
        if name in doc["errors"]:
            break
    return doc


def main(args: list[str]) -> int:
    started = time.monotonic()
    try:
        plan = load_plan(args)
    except PlanError as exc:
        print(f"dgxspark bench driver: {exc}", file=sys.stderr)
        return 2
    bypass_proxy_for_loopback(os.environ)
    try:
        vllm = Vllm()
    except Exception as exc:  # pylint: disable=broad-exception-caught  # no usable vLLM in this container
        doc = {"vllm_version": None, "tokenizer": None, "results": {},
               "errors": {"import": f"cannot import vLLM's benchmark in this container: {exc}"}}
    else:
        doc = run_cases(plan, vllm, os.environ)
    shutil.rmtree(plan["result_dir"], ignore_errors=True)
    doc["elapsed_s"] = round(time.monotonic() - started, 3)
    sys.stdout.flush()
    print(MARKER + " " + json.dumps(doc, separators=(",", ":")), flush=True)
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
