//! The test app (`APP_R`) and a visitor's Shiny session over its WebSocket.

use super::*;

/// The app every test runs: its page says which copy served it, the
/// X-Forwarded-For it saw, and it has two reactive outputs over the
/// WebSocket: `live` (which copy, and its R's start time in clock ticks
/// since boot, field 22 of /proc/self/stat: the same inside the copy's PID
/// namespace and on the host, where its PID is not) and `echo` (input `n`
/// answered with the same), which [`Session`] reads.
pub const APP_R: &str = r#"
library(shiny)
if (Sys.getenv("BROKEN") == "yes") stop("this version is broken")
# The copy's own disk: was it empty when this process started?
marker <- file.path(Sys.getenv("SHINYCTL_SCRATCH"), "marker")
scratch <- if (file.exists(marker)) "kept" else "empty"
writeLines("x", marker)
started <- strsplit(sub(".*\\) ", "", readLines("/proc/self/stat", warn = FALSE)), " ")[[1]][20]
me <- paste0(Sys.getenv("SHINYCTL_COPY"), "-r-", started, "-end")
ui <- function(req) {
  fluidPage(
    tags$p(id = "scratch", paste0("scratch=", scratch, ";")),
    tags$p(id = "who", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")),
    tags$p(id = "xff", paste0("xff=", req$HTTP_X_FORWARDED_FOR, ";")),
    tags$p(id = "greeting", paste0("greeting=", Sys.getenv("GREETING"), ";")),
    textOutput("live"),
    textOutput("echo")
  )
}
server <- function(input, output, session) {
  output$live <- renderText(paste0("live-from-copy-", me))
  output$echo <- renderText(paste0("echo-", input$n, "-copy-", me))
}
shinyApp(ui, server)
"#;

/// A Shiny session: a WebSocket through the load balancer, initialised,
/// with the first value of the `live` output read. The one session opener
/// of the suite.
pub struct Session {
    pub(super) socket: tungstenite::WebSocket<std::net::TcpStream>,
    /// The copy the `live` output came from.
    pub copy: u32,
    /// Its R's start time in clock ticks, for an app that says it
    /// ([`APP_R`]: `live-from-copy-N-r-TICKS-end`); 0 otherwise.
    pub r_start: u64,
}

/// `N` or `N-r-TICKS-end` after a marker: the copy and its R's start.
pub(super) fn copy_and_r(after: &str) -> Option<(u32, u64)> {
    let digits: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
    let copy = digits.parse().ok()?;
    let r = after[digits.len()..].strip_prefix("-r-").and_then(|t| t.split_once("-end")).and_then(|(t, _)| t.parse().ok());
    Some((copy, r.unwrap_or(0)))
}

/// The next message's text from a WebSocket. A read that a signal
/// interrupted is tried again: a socket with a read timeout is never
/// restarted by the kernel (EINTR, whatever the handler's flags), and it
/// failed a session once so.
pub fn next_text(socket: &mut tungstenite::WebSocket<std::net::TcpStream>) -> Result<String, String> {
    loop {
        match socket.read() {
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
            Ok(m) => return Ok(m.into_text().unwrap_or_default().to_string()),
        }
    }
}

impl Session {
    /// Opens a session with this cookie header (may be empty); panics when
    /// it does not open.
    pub fn open(port: u16, cookie: &str) -> Session {
        Session::try_open(port, cookie).unwrap_or_else(|e| panic!("a Shiny session through the load balancer: {e}"))
    }

    /// Opens a session with this cookie header (may be empty): the
    /// handshake (101), then the first `live` output, within 20 s.
    pub fn try_open(port: u16, cookie: &str) -> Result<Session, String> {
        use tungstenite::client::IntoClientRequest;
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(20))).map_err(|e| e.to_string())?;
        let mut req = format!("ws://127.0.0.1:{port}/websocket/").into_client_request().map_err(|e| e.to_string())?;
        if !cookie.is_empty() {
            req.headers_mut().insert("Cookie", cookie.parse().map_err(|_| format!("a bad cookie header {cookie:?}"))?);
        }
        let (mut socket, resp) = tungstenite::client(req, stream).map_err(|e| format!("handshake: {e}"))?;
        if resp.status() != 101 {
            return Err(format!("handshake answered {}", resp.status()));
        }
        let init = r#"{"method":"init","data":{".clientdata_output_live_hidden":false,".clientdata_output_echo_hidden":false}}"#;
        socket.send(tungstenite::Message::text(init)).map_err(|e| format!("init: {e}"))?;
        loop {
            let text = next_text(&mut socket).map_err(|e| format!("first output: {e}"))?;
            if let Some((copy, r_start)) = text.split_once("live-from-copy-").and_then(|(_, a)| copy_and_r(a)) {
                return Ok(Session { socket, copy, r_start });
            }
        }
    }

    /// Sends input `n` and waits for its echo (20 s at most): the session
    /// still works end to end. Returns the copy and R start that answered.
    pub fn echo(&mut self, n: u64) -> Result<(u32, u64), String> {
        let update = format!(r#"{{"method":"update","data":{{"n":{n}}}}}"#);
        self.socket.send(tungstenite::Message::text(update)).map_err(|e| format!("send: {e}"))?;
        let want = format!("echo-{n}-copy-");
        loop {
            let text = next_text(&mut self.socket).map_err(|e| format!("read: {e}"))?;
            if let Some(found) = text.split_once(&want).and_then(|(_, a)| copy_and_r(a)) {
                return Ok(found);
            }
        }
    }

    /// Panics unless input `n` is echoed by the copy the session opened on.
    pub fn still_on_its_copy(&mut self, n: u64) {
        let answered = self.echo(n).unwrap_or_else(|e| panic!("the session on copy {} still works: {e}", self.copy));
        assert_eq!(answered.0, self.copy, "the session is still answered by its own copy");
        if self.r_start != 0 {
            assert_eq!(answered.1, self.r_start, "by the same R process");
        }
    }

    /// Closes the session.
    pub fn close(mut self) {
        let _ = self.socket.close(None);
        let _ = self.socket.flush();
    }
}
