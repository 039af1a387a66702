"""SeaweedFS (`weed mini`) on free loopback ports with one S3 identity (and anonymous reads),
and a proxy in front of it that adds a latency to each request and counts requests by kind:
tests/support/fault_proxy.py (proxy="fault", which can also inject faults: the tests and
bench/s3_bench.py) or nginx (proxy="nginx", latency_proxy.nginx.conf: fast enough not to bind
a benchmark that makes a GET a sample). Objects are written with pyarrow's S3 client."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROXY = Path(__file__).resolve().parent / "fault_proxy.py"
NGINX_CONF = Path(__file__).resolve().parent / "latency_proxy.nginx.conf"
KEY, SECRET, BUCKET = "stokertestkey", "stokertestsecret", "wds"


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def nginx_available():
    """Whether nginx and its Lua module (Debian's libnginx-mod-http-lua) are installed."""
    return (shutil.which("nginx") is not None and
            Path("/usr/lib/nginx/modules/ngx_http_lua_module.so").exists())


class Server:
    """SeaweedFS behind a proxy adding `latency_ms` to each request. `static` (with
    proxy="nginx"): objects' GETs and HEADs are served by nginx from copies of what was put
    (latency_proxy.nginx.conf): a server whose work per request is not on the client's cores."""

    def __init__(self, weed, root, latency_ms=0.0, proxy="fault", static=False):
        if proxy not in ("fault", "nginx"):
            raise ValueError(f"proxy={proxy!r}: 'fault' or 'nginx'")
        if static and proxy != "nginx":
            raise ValueError("static=True serves objects from nginx: proxy='nginx'")
        self.static = static
        if proxy == "nginx" and not nginx_available():
            raise RuntimeError("proxy='nginx' needs nginx with its Lua module "
                               "(apt-get install nginx libnginx-mod-http-lua)")
        self.root, self.proxy_kind = root, proxy
        (root / "data").mkdir()
        (root / "s3.json").write_text(json.dumps({"identities": [{
            "name": "stoker", "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "anonymous", "actions": ["Read"]}]}))
        p = free_ports(10)
        self.s3_port, self.filer_port = p[6], p[4]
        names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                 "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port",
                 "admin.port.grpc")
        self.log = open(root / "weed.log", "wb")
        self.weed = subprocess.Popen(
            [weed, "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"] +
            [f"-{n}={port}" for n, port in zip(names, p)] +
            ["-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
             "-master.telemetry=false", f"-s3.config={root / 's3.json'}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        if proxy == "nginx":
            (root / "proxy.port").write_text(str(free_ports(1)[0]))
            (root / "nginx-tmp").mkdir()
            conf = NGINX_CONF.read_text()
            for name, value in (("ROOT", root), ("PORT", (root / "proxy.port").read_text()),
                                ("UPSTREAM", f"127.0.0.1:{self.s3_port}"),
                                ("LATENCY_S", f"{latency_ms / 1000:.6f}"),
                                ("STATIC", "true" if static else "false")):
                conf = conf.replace(f"@{name}@", str(value))
            (root / "nginx.conf").write_text(conf)
            command = ["nginx", "-p", str(root), "-c", str(root / "nginx.conf")]
        else:
            command = [sys.executable, str(PROXY), "--upstream", f"127.0.0.1:{self.s3_port}",
                       "--port-file", str(root / "proxy.port"), "--latency-ms", str(latency_ms)]
        self.proxy = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        from pyarrow import fs
        self.fs = fs.S3FileSystem(access_key=KEY, secret_key=SECRET, scheme="http",
                                  allow_bucket_creation=True,
                                  endpoint_override=f"127.0.0.1:{self.s3_port}")
        deadline, last = time.monotonic() + 90, None
        while True:  # up when a bucket can be made (the volume server registers late)
            try:
                self.fs.create_dir(BUCKET)
                self.put("probe", b"x")
                break
            except OSError as e:
                last = e
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not come up in 90 s ({root}/weed.log): {last}")
            time.sleep(0.2)
        while not (root / "proxy.port").exists():
            assert time.monotonic() < deadline, "the fault proxy did not start"
            time.sleep(0.05)
        self.proxy_port = int((root / "proxy.port").read_text())
        while True:  # nginx's port is chosen before it listens
            try:
                socket.create_connection(("127.0.0.1", self.proxy_port), timeout=1).close()
                break
            except OSError:
                if self.proxy.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {proxy} proxy did not start ({root}/weed.log)")
                time.sleep(0.05)

    def put(self, key, data):
        with self.fs.open_output_stream(f"{BUCKET}/{key}") as f:
            f.write(data)
        if self.static:
            mirror = self.root / "mirror" / BUCKET / key
            mirror.parent.mkdir(parents=True, exist_ok=True)
            mirror.write_bytes(data)

    def control(self, path, body=None):
        if self.proxy_kind == "nginx" and path not in ("counts", "reset"):
            raise RuntimeError(f"the nginx proxy injects no faults ({path}): proxy='fault'")
        req = urllib.request.Request(f"http://127.0.0.1:{self.proxy_port}/__proxy/{path}",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     method="POST" if body is not None else "GET")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=30) as r:
            return json.loads(r.read())

    def cpu_seconds(self):
        """CPU time (user + system) the server and its proxy have used so far: what a
        benchmark on the same cores lends them (a remote bucket costs the node nothing)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for top in (self.weed.pid, self.proxy.pid):
            try:
                children = Path(f"/proc/{top}/task/{top}/children").read_text().split()
            except OSError:
                continue
            for pid in [top, *map(int, children)]:  # nginx: its worker
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def counts(self):
        return self.control("counts")["counts"]

    def reset(self):
        self.control("reset", {})

    def stop(self):
        for p in (self.proxy, self.weed):
            p.terminate()
        for p in (self.proxy, self.weed):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()
