"""Try a TCP connection to each HOST:PORT given; print one line per target: connected, refused (a reset: the
firewall's reject, or no listener), timeout (dropped) or the error's name. Runs on the lab host and in the probe."""
import socket
import sys

for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect((host, int(port)))
        result = "connected"
    except ConnectionRefusedError:
        result = "refused"
    except socket.timeout:
        result = "timeout"
    except OSError as exc:
        result = type(exc).__name__
    finally:
        sock.close()
    print(target, result)
