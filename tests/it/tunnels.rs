//! Open Shiny sessions survive an upgrade of the load balancer: a WebSocket
//! opened through a load balancer of one build carries inputs and outputs
//! afterwards through the load balancer of the next, to the same R process.

use std::net::TcpStream;
use std::time::Duration;

use crate::helpers::*;
use std::path::Path;

/// An app whose output says the input doubled and which R process made it.
const APP_R: &str = r#"
library(shiny)
ui <- fluidPage(numericInput("n", "n", 1), textOutput("out"))
server <- function(input, output, session) {
  output$out <- renderText(paste0("out=", input$n * 2, "@", Sys.getpid()))
}
shinyApp(ui, server)
"#;

type Socket = tungstenite::WebSocket<TcpStream>;

/// Applies `manifest` (app `app` on `port`) with the `old` binary and
/// waits for `roles` and a page; returns the old daemon's and load
/// balancer's PIDs.
fn started_on(env: &Env, old: &Path, manifest: &Path, app: &str, port: u16, roles: &str) -> (u32, u32) {
    let out = env.run_binary(old, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    env.wait_roles(app, roles, Duration::from_secs(60));
    wait_http_ok(port, Duration::from_secs(10));
    let status = env.status();
    let (daemon, proxy) = (status["daemon_pid"].as_u64().unwrap() as u32, status["proxy_pid"].as_u64().unwrap() as u32);
    assert!(cmdline(proxy).contains("old-build"), "the load balancer is the old build's");
    (daemon, proxy)
}

/// The README's upgrade line: the old daemon stopped, this build's started
/// (`serve -d`); waits until the old load balancer has been replaced and is
/// gone.
fn upgrade_daemon(env: &Env, old_daemon: u32, old_proxy: u32) {
    signal(old_daemon, 15);
    wait_gone(old_daemon, Duration::from_secs(10), "the old daemon to exit");
    env.ok(&["serve", "-d"]);
    wait_until(Duration::from_secs(60), "the old load balancer to be replaced and gone", || {
        let p = env.status()["proxy_pid"].as_u64()? as u32;
        (p != old_proxy && !pid_alive(old_proxy)).then_some(())
    });
    let new_proxy = env.status()["proxy_pid"].as_u64().unwrap() as u32;
    assert!(!cmdline(new_proxy).contains("old-build"), "the new load balancer is this build's");
}

/// Opens a Shiny session on `port` with input `n` = 1; returns it and the
/// PID of the R process that answered.
fn open(port: u16) -> (Socket, u32) {
    use tungstenite::client::IntoClientRequest;
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let req = format!("ws://127.0.0.1:{port}/websocket/").into_client_request().unwrap();
    let (mut socket, resp) = tungstenite::client(req, stream).expect("WebSocket handshake through the load balancer");
    assert_eq!(resp.status(), 101);
    let init = r#"{"method":"init","data":{"n":1,".clientdata_output_out_hidden":false}}"#;
    socket.send(tungstenite::Message::text(init)).unwrap();
    let pid = output(&mut socket, 2);
    (socket, pid)
}

/// Reads messages until the output shows `want`; returns the R PID it names.
fn output(socket: &mut Socket, want: u32) -> u32 {
    let needle = format!("out={want}@");
    loop {
        let text = socket.read().expect("a message from Shiny on the same WebSocket").into_text().unwrap_or_default();
        if let Some(pid) = between(&text, &needle, "\"") {
            return pid.parse().expect("a PID");
        }
    }
}

/// Sends input `n` on the session.
fn input(socket: &mut Socket, n: u32) {
    let msg = format!(r#"{{"method":"update","data":{{"n":{n}}}}}"#);
    socket.send(tungstenite::Message::text(msg)).expect("the WebSocket takes an input");
}

#[test]
fn an_open_shiny_session_keeps_working_through_a_load_balancer_upgrade() {
    let env = Env::new("tunnels");
    let old = another_build(&env.dir);
    let port = free_port();
    let manifest = env.app("ws", port, "warm-replicas: 0\n");
    std::fs::write(manifest.parent().unwrap().join("app.R"), APP_R).unwrap();
    let (old_daemon, old_proxy) = started_on(&env, &old, &manifest, "ws", port, "1:active");

    let (mut socket, r_pid) = open(port);
    input(&mut socket, 5);
    assert_eq!(output(&mut socket, 10), r_pid);
    wait_until(Duration::from_secs(20), "the session counted on copy 1", || (env.copies("ws")[0].sessions == 1).then_some(()));

    // The README's line: the daemon stopped, a new one of this build started.
    upgrade_daemon(&env, old_daemon, old_proxy);

    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains("handed 1 open WebSocket sessions to the new load balancer"), "the old one handed it over:\n{log}");
    assert!(log.contains("adopted 1 open WebSocket sessions"), "the new one adopted it:\n{log}");

    // The same WebSocket, through the new load balancer, to the same R.
    input(&mut socket, 21);
    assert_eq!(output(&mut socket, 42), r_pid, "the same R process answers");
    input(&mut socket, 50);
    assert_eq!(output(&mut socket, 100), r_pid);
    wait_until(Duration::from_secs(20), "the new load balancer to count the session", || (env.copies("ws")[0].sessions == 1).then_some(()));

    // Closing it ends the session there.
    let _ = socket.close(None);
    let _ = socket.flush();
    drop(socket);
    wait_until(Duration::from_secs(20), "the session to end", || (env.copies("ws")[0].sessions == 0).then_some(()));
}
