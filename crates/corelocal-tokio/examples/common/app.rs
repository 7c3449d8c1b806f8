//! The axum app shared by the `axum` example (on corelocal-tokio), the `axum-multithread`
//! baseline (tokio's default multi-thread runtime) and the tests: the same handlers on both.

use axum::routing::get;
use axum::Router;

/// The hello page.
pub const HELLO: &str = "<!doctype html>\n<html><head><title>corelocal-tokio</title></head>\
<body><h1>Hello from corelocal-tokio</h1><p>GET /cpu answers the CPU that served the request.</p>\
</body></html>\n";

/// `GET /` a hello page, `GET /hello` the 6-byte `hello\n` that `corelocal bench compare`'s
/// HTTP presets answer (so the app can be one of its `--server`s), `GET /cpu` the CPU the
/// handler runs on (`sched_getcpu`): on corelocal-tokio the worker's pinned CPU.
pub fn router() -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Html(HELLO) }))
        .route("/hello", get(|| async { "hello\n" }))
        .route(
            "/cpu",
            get(|| async { format!("{}\n", corelocal::cpu::current_cpu()) }),
        )
}
