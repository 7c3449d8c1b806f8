# A small HTTP server on Python's asyncio (epoll) with SO_REUSEPORT, meant to be started once
# per CPU (bench/steer.sh; crates/corelocal-steer/tests/servers.rs includes this file).
import asyncio, os, sys
async def handle(r, w):
    close = False
    try:
        while True:
            line = await r.readline()
            if not line:
                break
            close = close or line.lower().startswith(b'connection: close')
            if line in (b'\r\n', b'\n'):
                w.write(b'HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Pid: %d\r\n\r\nok\n' % os.getpid())
                await w.drain()
                if close:
                    break
    except ConnectionError:
        pass
    w.close()
async def main():
    srv = await asyncio.start_server(handle, '127.0.0.1', int(sys.argv[1]), reuse_port=True, backlog=1024)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
