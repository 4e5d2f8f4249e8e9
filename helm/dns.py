"""The cluster's DNS for helm/kubelet.py: answers A queries for the names
in a JSON file ({name: [address, ...]}, reread when it changes) and
NXDOMAIN for every other name, as CoreDNS does for a cluster's zone, so a
pod's search path works as in Kubernetes. UDP only; no recursion: nothing
outside the cluster resolves.

Usage (in a container on the cluster's network): python3 dns.py RECORDS
"""

import json
import os
import socket
import struct
import sys

RECORDS = sys.argv[1]
NOERROR, NXDOMAIN, FORMERR = 0, 3, 1


def load(cache):
    try:
        mtime = os.stat(RECORDS).st_mtime_ns
    except FileNotFoundError:
        return {}
    if cache.get("mtime") != mtime:
        with open(RECORDS) as f:
            cache["records"] = {k.lower(): v for k, v in json.load(f).items()}
        cache["mtime"] = mtime
    return cache["records"]


def parse_question(msg):
    labels, i = [], 12
    while True:
        n = msg[i]
        if n == 0 or n & 0xC0:
            break
        labels.append(msg[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype, qclass = struct.unpack("!HH", msg[i + 1:i + 5])
    return ".".join(labels).lower(), qtype, msg[12:i + 5]


def answer(msg, records):
    (qid, flags, qd) = struct.unpack("!HHH", msg[:6])
    if qd != 1:
        return struct.pack("!HHHHHH", qid, 0x8400 | FORMERR, 0, 0, 0, 0)
    name, qtype, question = parse_question(msg)
    rd = flags & 0x0100
    if name not in records:
        return struct.pack("!HHHHHH", qid, 0x8400 | rd | NXDOMAIN, 1, 0, 0, 0) + question
    ips = records[name] if qtype == 1 else []  # AAAA and others: no data
    out = struct.pack("!HHHHHH", qid, 0x8400 | rd | NOERROR, 1, len(ips), 0, 0) + question
    for ip in ips:
        out += struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(ip)
    return out


def main():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 53))
    cache = {}
    while True:
        msg, peer = s.recvfrom(512)
        try:
            s.sendto(answer(msg, load(cache)), peer)
        except (IndexError, struct.error, ValueError):
            continue


if __name__ == "__main__":
    main()
