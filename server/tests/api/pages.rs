//! The page itself, as a browser without script gets it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::helpers::{PATIENCE, spawn_app};

/// Building a server lists the page's routes, by running the app with its resources held back through a flag that
/// leptos keeps for the whole process (leptos-rs/leptos#4773). A page that another server of the same process
/// rendered meanwhile waited forever for its first resource: the tests build many servers in one process, and their
/// run hung on it now and then. The routes are listed once a process now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_renders_while_another_server_of_the_process_is_built() {
    let app = spawn_app().await;
    let (url, client) = (app.url("/"), app.client.clone());
    let built = Arc::new(AtomicBool::new(false));
    let rendering = tokio::spawn({
        let built = Arc::clone(&built);
        async move {
            let mut rendered = 0;
            loop {
                let page = tokio::time::timeout(PATIENCE, async {
                    client.get(&url).send().await?.text().await
                })
                .await
                .expect("the page is rendered while another server is built")
                .expect("the page");
                assert!(page.contains("<title>toolgate</title>"), "{page}");
                rendered += 1;
                if built.load(Ordering::Acquire) {
                    return rendered;
                }
            }
        }
    });
    for _ in 0..20 {
        drop(spawn_app().await);
    }
    built.store(true, Ordering::Release);
    assert!(rendering.await.expect("every page is rendered") > 1);
}
