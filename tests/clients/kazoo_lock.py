#!/usr/bin/python3
"""An independent ZooKeeper lock client for the token tests: kazoo's Lock recipe.

    kazoo_lock.py HOSTS SESSION_SECONDS LOCK_PATH -- COMMAND...

Takes the lock at LOCK_PATH (kazoo's own recipe and node names), runs COMMAND with
FENCING_TOKEN set to the lock node's czxid as epoch.counter (docs/tokens.md), and
releases the lock when COMMAND exits; exits with COMMAND's code. Kazoo's thread keeps
the session alive while COMMAND runs; a paused process stops it, as it should.

Run by Debian's python3 (/usr/bin/python3), which python3-kazoo is installed for.
"""
import os
import subprocess
import sys

from kazoo.client import KazooClient


def main():
    hosts, session, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    command = sys.argv[sys.argv.index("--") + 1:]
    client = KazooClient(hosts=hosts, timeout=session)
    client.start(timeout=10)
    lock = client.Lock(path, "kazoo")
    lock.acquire()
    czxid = client.exists(path + "/" + lock.node).czxid
    token = "%d.%d" % (czxid >> 32, czxid & 0xFFFFFFFF)
    code = subprocess.call(command, env=dict(os.environ, FENCING_TOKEN=token))
    try:
        lock.release()
        client.stop()
    except Exception as e:  # the session may have expired while COMMAND ran
        print("kazoo_lock: releasing: %s" % e, file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
