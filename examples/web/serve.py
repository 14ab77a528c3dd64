#!/usr/bin/env python3
"""Serves the browser demo (examples/web) on 127.0.0.1 and stores the result the page POSTs
to /result. With --test it also drives headless Chromium through chromedriver (the W3C
WebDriver protocol over plain HTTP, so only the standard library is needed): it opens the page,
waits for the result, saves a full-page screenshot and exits 0 only if the page says "pass".

    python3 examples/web/serve.py                 # serve; open the printed URL in a browser
    python3 examples/web/serve.py --test          # headless run, as .ci/run does
"""

import argparse
import base64
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Headless Chromium without a GPU: --enable-unsafe-webgpu lifts the blocklist, and the adapter
# is Dawn on SwiftShader's Vulkan, which Debian's chromium package ships (libvk_swiftshader.so).
# It is named explicitly so that a machine's own Vulkan driver (lavapipe, a GPU) is not
# picked instead: the run is then the same everywhere.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--use-webgpu-adapter=swiftshader",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
]


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm",
        ".js": "text/javascript",
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=HERE, **kwargs)

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def do_POST(self):
        if self.path != "/result":
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            result = json.loads(body)
        except ValueError:
            self.send_error(400, "not JSON")
            return
        self.send_response(204)
        self.end_headers()
        self.server.on_result(result)

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)


class Server(http.server.ThreadingHTTPServer):
    def __init__(self, port, verbose, out):
        super().__init__(("127.0.0.1", port), Handler)
        self.verbose = verbose
        self.out = out
        self.result = None
        self.got = threading.Event()

    def on_result(self, result):
        self.result = result
        os.makedirs(os.path.dirname(self.out), exist_ok=True)
        with open(self.out, "w") as f:
            json.dump(result, f)
        print(f"result: {result.get('status')} — {result.get('message')} (saved to {self.out})")
        self.got.set()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriver:
    """The few W3C WebDriver calls the test needs, against a chromedriver it starts."""

    def __init__(self, driver, chromium, flags):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [driver, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                if self.call("GET", "/status")["ready"]:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": flags},
            "goog:loggingPrefs": {"browser": "ALL"},
        }
        value = self.call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.session = f"/session/{value['sessionId']}"

    def call(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.load(r)["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"webdriver {method} {path}: {e.read().decode()[:2000]}") from None

    def go(self, url):
        self.call("POST", self.session + "/url", {"url": url})

    def script(self, js):
        return self.call("POST", self.session + "/execute/sync", {"script": js, "args": []})

    def cdp(self, cmd, params):
        return self.call("POST", self.session + "/goog/cdp/execute", {"cmd": cmd, "params": params})

    def screenshot(self, path):
        """A screenshot of the whole page, not just the window."""
        w, h = self.script(
            "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
        )
        try:
            self.cdp(
                "Emulation.setDeviceMetricsOverride",
                {"width": max(w, 1280), "height": h, "deviceScaleFactor": 1, "mobile": False},
            )
            png = self.cdp("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        except RuntimeError:
            png = self.call("GET", self.session + "/screenshot")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(png))

    def console(self):
        try:
            return [e["message"] for e in self.call("POST", self.session + "/se/log", {"type": "browser"})]
        except (RuntimeError, OSError, KeyError, TypeError):
            return []

    def quit(self):
        try:
            self.call("DELETE", self.session, timeout=10)
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def find(names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def run_test(server, url, args):
    chromium = args.chromium or find(["chromium", "chromium-browser", "google-chrome"])
    driver = args.chromedriver or find(["chromedriver"])
    if not chromium or not driver:
        print("needs chromium and chromedriver (apt-get install chromium chromium-driver)", file=sys.stderr)
        return 2
    profile = tempfile.mkdtemp(prefix="qsa-web-chromium-")
    flags = CHROMIUM_FLAGS + [f"--user-data-dir={profile}"] + args.flag
    start = time.time()
    wd = None
    try:
        wd = WebDriver(driver, chromium, flags)
        wd.go(url)
        if not server.got.wait(args.timeout):
            status = wd.script("return document.getElementById('result').dataset.status")
            print(f"no result after {args.timeout} s (page status: {status})", file=sys.stderr)
            for line in wd.console():
                print("console:", line, file=sys.stderr)
            wd.screenshot(args.screenshot)
            return 1
        # The page has drawn everything before it POSTs; give the compositor a frame.
        time.sleep(0.5)
        wd.screenshot(args.screenshot)
        print(f"screenshot: {args.screenshot}")
    finally:
        if wd:
            wd.quit()
        shutil.rmtree(profile, ignore_errors=True)
    r = server.result
    print(f"headless run: {time.time() - start:.1f} s")
    print(f"adapter: {r.get('adapter', '-')}")
    for c in r.get("checks", []):
        print(f"  {'ok  ' if c['pass'] else 'FAIL'} {c['name']}: {c['detail']}")
    if r.get("totals_ms"):
        t = r["totals_ms"]
        print("  stage totals (ms): " + ", ".join(f"{k} {t[k]:.1f}" for k in r.get("stages", t)))
    for line in r.get("console", []):
        print("  console:", line)
    return 0 if r.get("status") == "pass" else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0, help="default: 8000 when serving, any free one with --test")
    ap.add_argument("--test", action="store_true", help="drive headless Chromium and check the result")
    ap.add_argument("--query", default="", help="URL query with demo options, e.g. 'dtype=bf16&k=32'")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for the page's result")
    ap.add_argument("--screenshot", default=os.path.join(REPO, "target", "web-demo.png"))
    ap.add_argument("--result", default=os.path.join(REPO, "target", "web-result.json"))
    ap.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    ap.add_argument("--chromedriver", help="chromedriver binary (default: on PATH)")
    ap.add_argument("--flag", action="append", default=[], help="extra Chromium flag (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(HERE, "pkg", "qsa_web_bg.wasm")):
        print("note: examples/web/pkg is missing; run examples/web/build.sh first", file=sys.stderr)
    port = args.port or (0 if args.test else 8000)
    server = Server(port, args.verbose, args.result)
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
    if args.query:
        url += "?" + args.query
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if not args.test:
        print(f"serving examples/web at {url} (Ctrl-C to stop)")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            return 0
    try:
        return run_test(server, url, args)
    finally:
        server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
