#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for tests/object_store_test.cc.

Forwards every request to an upstream server (the test's SeaweedFS) with its headers unchanged
(the Host header included, so S3 signatures still hold) and counts requests by kind (LIST, HEAD,
GET, PUT). Faults are queued by the test and applied, one per request, to the next GETs of data
(ranged GETs, not listings):

  503       503 SlowDown with an S3 error body (what S3 answers to too many requests)
  500       500 InternalError
  429       429 TooManyRequests
  drop      the upstream's headers and half of its body, then the connection closed
  short     a Content-Length of half the body and that half (the connection kept): a short body
  reset     the connection closed before any response
  stall     the upstream's headers, then nothing for 10 s (a stalled transfer: the client's
            stall timeout should end it first), then the connection closed

With --latency-ms, every forwarded request waits that long first (a distant server's round
trip; bench/s3_bench.py uses it).

Control (not forwarded): POST /__proxy/faults with a JSON list of fault names appends them;
POST /__proxy/fault_rate with {"rate": R, "kinds": [...], "seed": S} makes each later data GET
(once the queue is empty) fail with probability R, the kinds taken in turn (rate 0: none);
GET /__proxy/counts returns the counts and the faults still queued; POST /__proxy/reset clears
both. The port is written to --port-file once the proxy listens (port 0: any free port).
"""
import argparse
import http.client
import json
import os
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
FAULTS = []
# GET_repeated: GETs of a path and range asked for before (a client's retry after a failure
# the proxy did not make, e.g. a timeout on a loaded machine); a test of how many requests an
# epoch makes subtracts them.
COUNTS = {"LIST": 0, "HEAD": 0, "GET": 0, "PUT": 0, "faults_applied": 0, "GET_repeated": 0}
SEEN = set()
UPSTREAM = ("127.0.0.1", 0)
LATENCY_S = 0.0
RATE = {"rate": 0.0, "kinds": [], "next": 0, "rng": random.Random(0)}

ERROR_BODIES = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    429: ("TooManyRequests", "Too many requests."),
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _reply(self, status, body, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _control(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with LOCK:
            if self.path == "/__proxy/faults":
                FAULTS.extend(json.loads(body))
            elif self.path == "/__proxy/fault_rate":
                spec = json.loads(body)
                RATE.update(rate=float(spec["rate"]), kinds=list(spec.get("kinds") or ["503"]),
                            next=0, rng=random.Random(spec.get("seed", 0)))
            elif self.path == "/__proxy/reset":
                FAULTS.clear()
                SEEN.clear()
                RATE["rate"] = 0.0
                for k in COUNTS:
                    COUNTS[k] = 0
            out = json.dumps({"counts": COUNTS, "queued": FAULTS}).encode()
        self._reply(200, out)

    def do_GET(self):
        self._forward()

    def do_HEAD(self):
        self._forward()

    def do_PUT(self):
        self._forward()

    def do_POST(self):
        self._forward()

    def _forward(self):
        if self.path.startswith("/__proxy/"):
            self._control()
            return
        method = self.command
        kind = "LIST" if method == "GET" and "list-type=" in self.path else method
        fault = None
        with LOCK:
            COUNTS[kind] = COUNTS.get(kind, 0) + 1
            if kind == "GET":
                asked = (self.path, self.headers.get("Range"))
                COUNTS["GET_repeated"] += asked in SEEN
                SEEN.add(asked)
            if kind == "GET" and self.headers.get("Range") and FAULTS:
                fault = FAULTS.pop(0)
                COUNTS["faults_applied"] += 1
            elif (kind == "GET" and self.headers.get("Range") and RATE["rate"] > 0
                  and RATE["rng"].random() < RATE["rate"]):
                fault = RATE["kinds"][RATE["next"] % len(RATE["kinds"])]
                RATE["next"] += 1
                COUNTS["faults_applied"] += 1
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if LATENCY_S > 0:
            time.sleep(LATENCY_S)

        if fault == "reset":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault in ("503", "500", "429"):
            status = int(fault)
            code, message = ERROR_BODIES[status]
            xml = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code>'
                "<Message>%s</Message></Error>" % (code, message)
            ).encode()
            self._reply(status, xml, "application/xml")
            return

        conn = http.client.HTTPConnection(*UPSTREAM, timeout=60)
        conn.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() in ("connection", "proxy-connection", "keep-alive"):
                continue
            conn.putheader(name, value)
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()

        self.send_response(resp.status, resp.reason)
        for name, value in resp.getheaders():
            lname = name.lower()
            if lname in ("transfer-encoding", "connection", "keep-alive", "content-length"):
                continue
            self.send_header(name, value)
        if method == "HEAD":
            self.send_header("Content-Length", resp.getheader("Content-Length", "0"))
            self.end_headers()
            return
        half = len(data) // 2
        if fault == "short":
            self.send_header("Content-Length", str(half))
            self.end_headers()
            self.wfile.write(data[:half])
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault == "stall":
            self.wfile.flush()
            time.sleep(10)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "drop":
            self.wfile.write(data[:half])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)


def main():
    global UPSTREAM, LATENCY_S
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True, help="HOST:PORT")
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    LATENCY_S = args.latency_ms / 1000
    host, port = args.upstream.rsplit(":", 1)
    UPSTREAM = (host, int(port))
    # A deep accept queue: the tests open 64 connections at once.
    ThreadingHTTPServer.request_queue_size = 256
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
