"""Shows that TensorBoard opens the graphs tf_amp logs: a real browser renders them.

1. Writes a rewrite's logs: a small Keras model's training step under ``tf_amp.function``, with
   ``RewriteConfig(log_dir=...)`` and the float16 target (any machine); or uses ``--logdir``.
2. Starts ``tensorboard --logdir LOG/tensorboard --host 127.0.0.1 --port 0`` (its own process
   group) and checks its HTTP API: ``/data/runs`` and ``/data/plugin/graphs/info`` list the
   ``before`` and ``after`` runs, and ``/data/plugin/graphs/graph`` serves each as the graph that
   was logged (the node names of the ``.pb`` file; the ``after`` graph holds tf_amp's casts to
   the half type, the ``before`` graph none).
3. Drives headless Chromium over the DevTools protocol (``--remote-debugging-pipe``: NUL-separated
   JSON on file descriptors 3 and 4, no port and no websocket library). It opens the Graphs tab
   (``/#graphs``) and reads the rendered page, shadow roots included: the Run menu lists both
   runs and a graph is drawn. Then, for each run, it opens the Run menu and clicks the run (mouse
   events at the item's place, as a person would; a ``#graphs&run=RUN`` link does not do it in
   TensorBoard 2.21: the dashboard takes the run, but its menu and the drawn graph stay on the
   first run) and waits until the menu shows it, TensorBoard's in-page model of the drawn graph
   holds exactly the logged graph's nodes, and the scene has settled. The ``after`` scene must
   draw a tf_amp cast and the ``before`` scene none; a "Graph visualization failed" message or
   an exception thrown in the page fails the check. A screenshot of each goes to ``--out``.

Prints one JSON report; exits 0 when every check passed, 1 when one failed, 2 when no Chromium
was found (``apt-get install chromium``). Every process it starts is ended on the way out.

    .venv/bin/python scripts/check_tensorboard_graphs.py --out /tmp/tb-check
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import glob
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")
TF_AMP_CAST = re.compile(r"-CastTo(Fp16|Bf16)-tf_amp$")
FAILED_TEXT = "Graph visualization failed"
# TensorBoard renames an op whose name is also a name scope ("Add" beside "Add/ReadVariableOp")
# to "Add/(Add)" in its graph model.
SCOPE_CLASH = re.compile(r"/\(([^/]+)\)$")


def logged_name(model_name: str) -> str:
    """The GraphDef name of a node of TensorBoard's in-page graph model."""
    found = SCOPE_CLASH.search(model_name)
    if found and model_name[: found.start()].rsplit("/", 1)[-1] == found.group(1):
        return model_name[: found.start()]
    return model_name


class CheckFailed(Exception):
    pass


def find_chromium(explicit: str | None = None) -> str | None:
    if explicit:
        return shutil.which(explicit) or (explicit if os.access(explicit, os.X_OK) else None)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


# --- 1. the logs --------------------------------------------------------------------------------


def write_rewrite_logs(log_dir: str) -> None:
    """One rewritten training step of a small Keras model, logged under ``log_dir``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import tf_amp

    config = tf_amp.RewriteConfig(target_dtype="float16", log_dir=log_dir)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)]
    )
    optimizer = keras.optimizers.SGD(0.1)

    @tf_amp.function(config=config)
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    train_step(tf.ones((4, 8)), tf.zeros((4, 4)))


def logged_rewrites(log_dir: str) -> list[dict[str, Any]]:
    """Per logged rewrite: its TensorBoard run names and the node names of its .pb files."""
    from tensorflow.core.framework import graph_pb2

    def names(path: str) -> list[str]:
        graph = graph_pb2.GraphDef()
        with open(path, "rb") as f:
            graph.ParseFromString(f.read())
        return sorted(node.name for node in graph.node)

    rewrites = []
    for stamp_dir in sorted(glob.glob(os.path.join(log_dir, "tensorboard", "*"))):
        stamp = os.path.basename(stamp_dir)
        before = os.path.join(log_dir, f"graphdef_preop_{stamp}.pb")
        after = os.path.join(log_dir, f"graphdef_AutoMixedPrecision_{stamp}.pb")
        if not (os.path.isdir(os.path.join(stamp_dir, "before")) and os.path.exists(after)):
            continue
        rewrites.append(
            {
                "stamp": stamp,
                "runs": {"before": f"{stamp}/before", "after": f"{stamp}/after"},
                "nodes": {"before": names(before), "after": names(after)},
            }
        )
    return rewrites


# --- processes ----------------------------------------------------------------------------------


def stop_group(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """End a process started with ``start_new_session=True`` and everything it started."""
    if proc is None or (proc.poll() is not None and not _group_alive(proc.pid)):
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(proc.pid):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def tensorboard(logdir: str, timeout: float) -> Iterator[str]:
    """Runs TensorBoard on a free loopback port; yields its base URL."""
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "tensorboard.main"]
    cmd += ["--logdir", logdir, "--host", "127.0.0.1", "--port", "0"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=env, start_new_session=True, text=True, errors="replace",
    )
    lines: list[str] = []
    url: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r"TensorBoard \S+ at (http://\S+?)/? ", line)
            if found:
                url.put(found.group(1))

    threading.Thread(target=read, daemon=True).start()
    try:
        try:
            base = url.get(timeout=timeout)
        except queue.Empty:
            raise CheckFailed(
                f"TensorBoard printed no URL in {timeout:.0f} s (exit {proc.poll()}):\n"
                + "".join(lines[-20:])
            ) from None
        yield base
    finally:
        stop_group(proc)


def http_get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


# --- 2. TensorBoard's HTTP API ------------------------------------------------------------------


def check_http(base: str, rewrite: dict[str, Any], timeout: float) -> dict[str, Any]:
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    wanted = set(rewrite["runs"].values())
    deadline = time.monotonic() + timeout
    runs: list[str] = []
    while time.monotonic() < deadline:  # the data server loads the logdir in the background
        runs = json.loads(http_get(base + "/data/runs"))
        if wanted <= set(runs):
            break
        time.sleep(0.5)
    else:
        raise CheckFailed(f"/data/runs lists {runs}, not both of {sorted(wanted)}")
    info = json.loads(http_get(base + "/data/plugin/graphs/info"))
    for run in wanted:
        if not info.get(run, {}).get("run_graph"):
            raise CheckFailed(f"/data/plugin/graphs/info has no run graph for {run}: {info}")
    served: dict[str, Any] = {}
    for kind, run in rewrite["runs"].items():
        query = urllib.parse.urlencode({"run": run, "conceptual": "false"})
        graph = text_format.Parse(
            http_get(f"{base}/data/plugin/graphs/graph?{query}").decode(), graph_pb2.GraphDef()
        )
        names = sorted(node.name for node in graph.node)
        if names != rewrite["nodes"][kind]:
            raise CheckFailed(
                f"TensorBoard serves {len(names)} nodes for {run}, the logged "
                f"graph has {len(rewrite['nodes'][kind])}"
            )
        casts = [
            node.name for node in graph.node
            if node.op == "Cast" and TF_AMP_CAST.search(node.name)
        ]
        if (kind == "after") != bool(casts):
            raise CheckFailed(f"{run}: tf_amp casts served: {casts}")
        served[kind] = {"run": run, "nodes": len(names), "tf_amp_casts": len(casts)}
    return {"runs": runs, "graphs": served}


# --- 3. the browser -----------------------------------------------------------------------------


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4)."""

    def __init__(self, exe: str, profile_dir: str) -> None:
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Moved above 9 first, so that dup2 onto 3 and 4 in the child cannot overwrite them.
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)

        def in_child() -> None:
            os.dup2(child_r, 3)  # dup2's copies are inheritable: they survive the exec
            os.dup2(child_w, 4)

        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by close()
        args = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--remote-debugging-pipe", f"--user-data-dir={profile_dir}",
            "--window-size=1400,1000", "about:blank",
        ]
        try:
            # close_fds=False: only inheritable descriptors (3 and 4) reach the browser, as
            # Python opens everything else close-on-exec.
            self.proc: subprocess.Popen | None = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                preexec_fn=in_child, close_fds=False, start_new_session=True,
            )
        finally:
            os.close(child_r)
            os.close(child_w)
        self._out = os.fdopen(to_browser_w, "wb", buffering=0)
        self._in = os.fdopen(from_browser_r, "rb", buffering=0)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self._in.read(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._messages.put(None)
                return
            buffer += chunk
            while b"\0" in buffer:
                message, buffer = buffer.split(b"\0", 1)
                self._messages.put(json.loads(message))

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
        timeout: float = 30,
    ) -> dict[str, Any]:
        self._next_id += 1
        call_id = self._next_id
        message: dict[str, Any] = {"id": call_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._messages.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise CheckFailed(f"no reply to {method} in {timeout:.0f} s") from None
            if reply is None:
                raise CheckFailed(f"Chromium closed the pipe; stderr:\n{self.stderr_tail()}")
            if reply.get("id") != call_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise CheckFailed(f"{method}: {reply['error']}")
            return reply["result"]

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-3000:]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.send("Browser.close", timeout=5)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        stop_group(self.proc)
        self.proc = None
        for f in (self._out, self._in):
            with contextlib.suppress(OSError):
                f.close()
        self.stderr.close()


# Reads the rendered Graphs tab: every element, shadow roots included. The graph's node names
# are TensorBoard's own in-page model of the graph it drew (nodes plus the constants it folds
# into their consumers as "embeddings").
PAGE_STATE_JS = r"""(() => {
  const all = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      all.push(el);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  const tag = (name) => all.filter((el) => el.localName === name);
  const text = (el) => (el.textContent || '').trim();
  const centre = (el) => {
    const r = el.getBoundingClientRect();
    return [r.x + r.width / 2, r.y + r.height / 2, r.width * r.height];
  };
  const board = tag('tf-graph-board')[0];
  const graph = board && board.graph;
  const model = [];
  if (graph && graph.nodes) {
    for (const [name, node] of Object.entries(graph.nodes)) {
      model.push(name);
      for (const e of (node.inEmbeddings || []).concat(node.outEmbeddings || [])) {
        model.push(e.name);
      }
    }
  }
  return {
    dashboard: tag('tf-graph-dashboard').length > 0,
    menus: tag('paper-dropdown-menu').map((el) => ({value: el.value || '', at: centre(el)})),
    items: tag('paper-item').map((el) => ({text: text(el), at: centre(el)})),
    progress: board && board.progress ? board.progress.value : null,
    model_nodes: [...new Set(model)].sort(),
    scene_nodes: all.filter((el) => el.localName === 'g' && el.classList.contains('node'))
      .map((el) => el.getAttribute('data-name') || ''),
    // where each drawn node is: unchanged between two looks once the scene's animations end
    scene_layout: all.filter((el) => el.localName === 'g' && el.classList.contains('node'))
      .map((el) => [el.getAttribute('data-name'), el.getAttribute('transform'),
        getComputedStyle(el).opacity, JSON.stringify(el.getBoundingClientRect())].join(' ')),
    messages: tag('paper-toast').filter((el) => el.opened).map(text)
      .concat(tag('div').filter((el) => el.children.length === 0
        && text(el).startsWith('""" + FAILED_TEXT + r"""')).map(text)),
  };
})()"""


class GraphsTab:
    """The Graphs tab in one browser tab, used as a person would: the Run menu, clicked."""

    def __init__(self, browser: Chromium, base: str, timeout: float) -> None:
        self.browser = browser
        self.timeout = timeout
        self.target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send(
            "Target.attachToTarget", {"targetId": self.target, "flatten": True}
        )["sessionId"]
        self.send("Runtime.enable")
        self.send("Page.navigate", {"url": f"{base}/#graphs"})

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session)

    def state(self) -> dict[str, Any]:
        result = self.send("Runtime.evaluate", {"expression": PAGE_STATE_JS, "returnByValue": True})
        state = result.get("result", {}).get("value") or {}
        state["model_nodes"] = sorted({logged_name(n) for n in state.get("model_nodes", [])})
        return state

    def wait(
        self, what: str, done: Any, explain: Any = None, settled: bool = False
    ) -> dict[str, Any]:
        """Polls the page until ``done(state)`` (and, if ``settled``, until the drawn scene is
        the same in two looks 0.5 s apart: no node still fading in, out or moving); fails with
        the last state after the timeout (and ``explain(state)``, when given)."""
        deadline = time.monotonic() + self.timeout
        previous: list[str] | None = None
        while True:
            state = self.state()
            if any(FAILED_TEXT in m for m in state.get("messages", [])):
                raise CheckFailed(f"TensorBoard shows: {state['messages']}")
            if done(state):
                if not settled or state["scene_layout"] == previous:
                    return state
                previous = state["scene_layout"]
                time.sleep(0.5)
                continue
            previous = None
            if time.monotonic() > deadline:
                hidden = ("model_nodes", "items", "scene_layout")
                shown = {k: v for k, v in state.items() if k not in hidden}
                extra = f"; {explain(state)}" if explain else ""
                raise CheckFailed(
                    f"{what}: not seen in {self.timeout:.0f} s; page: {shown}{extra}"
                )
            time.sleep(0.25)

    def click(self, at: list[float]) -> None:
        x, y = at[0], at[1]
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    def choose_run(self, run: str, runs: list[str]) -> dict[str, Any]:
        """Opens the Run menu, clicks ``run``; returns the state once it is the one selected."""
        menu = next(m for m in self.state()["menus"] if m["value"] in runs)
        self.click(menu["at"])
        state = self.wait(
            f"{run} in the open Run menu",
            lambda s: any(i["text"] == run and i["at"][2] > 0 for i in s["items"]),
        )
        self.click(next(i for i in state["items"] if i["text"] == run and i["at"][2] > 0)["at"])
        return self.wait(f"{run} selected", lambda s: any(m["value"] == run for m in s["menus"]))

    def screenshot(self, path: str) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def exceptions(self) -> list[str]:
        return [
            e["params"]["exceptionDetails"].get("exception", {}).get("description")
            or e["params"]["exceptionDetails"].get("text", "")
            for e in self.browser.events
            if e.get("sessionId") == self.session and e.get("method") == "Runtime.exceptionThrown"
        ]

    def close(self) -> None:
        with contextlib.suppress(CheckFailed):
            self.browser.send("Target.closeTarget", {"targetId": self.target})


def check_browser(
    chromium: str, base: str, rewrite: dict[str, Any], timeout: float, out: str | None
) -> dict[str, Any]:
    runs = sorted(rewrite["runs"].values())
    pages: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tf-amp-chromium-") as profile:
        browser = Chromium(chromium, profile)
        try:
            version = browser.send("Browser.getVersion")["product"]
            started = time.monotonic()
            tab = GraphsTab(browser, base, timeout)
            try:
                first = tab.wait(
                    "the Graphs tab listing both runs and drawing a graph",
                    lambda s: s.get("dashboard")
                    and set(runs) <= {i["text"] for i in s["items"]}
                    and s["scene_nodes"] and s["progress"] == 100,
                    settled=True,
                )
                loaded = round(time.monotonic() - started, 1)
                for kind, run in rewrite["runs"].items():
                    t = time.monotonic()
                    tab.choose_run(run, runs)
                    logged = rewrite["nodes"][kind]
                    # The graph drawn is this run's once TensorBoard's model of it holds the
                    # logged graph's nodes, every one and no other (the other run's differ).
                    state = tab.wait(
                        f"the graph of {run} drawn",
                        lambda s, logged=logged: s["model_nodes"] == logged
                        and s["scene_nodes"] and s["progress"] == 100,
                        lambda s, logged=logged: "graph model: missing "
                        f"{sorted(set(logged) - set(s['model_nodes']))}, extra "
                        f"{sorted(set(s['model_nodes']) - set(logged))}",
                        settled=True,
                    )
                    if out:
                        tab.screenshot(os.path.join(out, f"graphs_{kind}.png"))
                    drawn_casts = sorted(n for n in state["scene_nodes"] if TF_AMP_CAST.search(n))
                    pages[kind] = {
                        "run": run,
                        "seconds": round(time.monotonic() - t, 1),
                        "runs_in_menu": sorted(set(runs) & {i["text"] for i in state["items"]}),
                        "model_nodes": len(state["model_nodes"]),
                        "scene_nodes": len(state["scene_nodes"]),
                        "tf_amp_casts_drawn": drawn_casts,
                    }
                    if (kind == "after") != bool(drawn_casts):
                        raise CheckFailed(f"{run}: tf_amp casts drawn: {drawn_casts}")
                exceptions = tab.exceptions()
            finally:
                tab.close()
        finally:
            browser.close()
    if exceptions:
        raise CheckFailed(f"the page threw: {exceptions}")
    return {
        "browser": version,
        "first_graph_seconds": loaded,
        "first_graph_drawn": [m["value"] for m in first["menus"] if m["value"] in runs],
        "pages": pages,
    }


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", help="a tf_amp log dir to check (default: write one)")
    parser.add_argument("--out", help="write the report and screenshots here")
    parser.add_argument("--chromium", help="the browser executable (default: found on PATH)")
    parser.add_argument("--timeout", type=float, default=90, help="seconds per wait")
    args = parser.parse_args(argv)

    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("error: no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    # SIGTERM (a CI timeout, a test runner giving up) ends this the way Ctrl-C does: through
    # the finally clauses that stop TensorBoard and Chromium.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    report: dict[str, Any] = {"ok": False}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tf-amp-tb-check-") as tmp:
        log_dir = args.logdir or os.path.join(tmp, "logs")
        try:
            if not args.logdir:
                write_rewrite_logs(log_dir)
            rewrites = logged_rewrites(log_dir)
            if not rewrites:
                raise CheckFailed(f"no logged rewrite (tensorboard/<id>/before, after): {log_dir}")
            rewrite = rewrites[-1]
            report["logged"] = {"log_dir": log_dir, "stamp": rewrite["stamp"]}
            with tensorboard(os.path.join(log_dir, "tensorboard"), args.timeout) as base:
                report["tensorboard"] = base
                t = time.monotonic()
                report["http"] = check_http(base, rewrite, args.timeout)
                report["http"]["seconds"] = round(time.monotonic() - t, 1)
                report["chromium"] = check_browser(chromium, base, rewrite, args.timeout, args.out)
            report["ok"] = True
        except CheckFailed as error:
            report["error"] = str(error)
    report["seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(report, indent=2, sort_keys=True)
    print(text)
    if args.out:
        with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
