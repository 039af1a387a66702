"""SeaweedFS (`weed mini`) on free loopback ports with one S3 identity (and anonymous reads),
and tests/support/fault_proxy.py in front of it: for tests/python/test_object_storage.py and
bench/s3_bench.py. Objects are written with pyarrow's S3 client."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROXY = Path(__file__).resolve().parent / "fault_proxy.py"
KEY, SECRET, BUCKET = "stokertestkey", "stokertestsecret", "wds"


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Server:
    def __init__(self, weed, root, latency_ms=0.0):
        self.root = root
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
        self.proxy = subprocess.Popen(
            [sys.executable, str(PROXY), "--upstream", f"127.0.0.1:{self.s3_port}",
             "--port-file", str(root / "proxy.port"), "--latency-ms", str(latency_ms)],
            stdout=self.log, stderr=subprocess.STDOUT)
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

    def put(self, key, data):
        with self.fs.open_output_stream(f"{BUCKET}/{key}") as f:
            f.write(data)

    def control(self, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.proxy_port}/__proxy/{path}",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     method="POST" if body is not None else "GET")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=30) as r:
            return json.loads(r.read())

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
