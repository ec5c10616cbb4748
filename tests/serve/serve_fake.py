"""A server on the fake engine in its own process, for the SIGTERM tests.

Usage: python tests/serve/serve_fake.py PORT_FILE SHUTDOWN_TIMEOUT_S. Writes the bound port to
PORT_FILE once listening; after shutdown prints what the engine saw as JSON.
"""

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeAsyncEngine, FakeTokenizer

from hwrun.serve.server import bound_port, make_server


def main() -> None:
    port_file, shutdown_timeout = Path(sys.argv[1]), float(sys.argv[2])
    engine = FakeAsyncEngine(tokenizer=FakeTokenizer(), step_s=0.05)
    server = make_server(engine, port=0, shutdown_timeout=shutdown_timeout, log_level="warning")

    def write_port() -> None:
        while not server.started:
            time.sleep(0.01)
        port_file.write_text(str(bound_port(server)))

    threading.Thread(target=write_port, daemon=True).start()
    server.run()
    print(json.dumps({"finished": engine.finished, "aborted": engine.aborted,
                      "shut_down": engine.shut_down}))  # fmt: skip


if __name__ == "__main__":
    main()
