"""Try a TCP connection to each HOST:PORT given; print one line per target, in the order given: connected, refused (a
reset: the firewall's reject, or no listener), timeout (dropped) or the error's name. The targets are tried at the
same time (a dropped one takes the whole timeout). Runs on the lab host and in the probe."""
import socket
import sys
from concurrent.futures import ThreadPoolExecutor


def attempt(target):
    host, port = target.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect((host.strip("[]"), int(port)))
        result = "connected"
    except ConnectionRefusedError:
        result = "refused"
    except socket.timeout:
        result = "timeout"
    except OSError as exc:
        result = type(exc).__name__
    finally:
        sock.close()
    return "%s %s" % (target, result)


with ThreadPoolExecutor(max_workers=64) as pool:
    for line in pool.map(attempt, sys.argv[1:]):
        print(line)
