//! The pool's zygote as the daemon starts it: the R expression it runs
//! and the variables through which the daemon and a claim speak to it (the
//! zygote's own code, in R's process, is the launcher's `zygote.rs`).

/// The environment variable through which a claimed copy's R gets its
/// program (the launcher's `claim::r_program`); R reads and removes it.
pub const PROGRAM_ENV: &str = "SHINYCTL_CLAIM_R";

/// The variable naming (comma-separated) the variables the daemon gave
/// the zygote, which a claimed copy's R drops before it takes the copy's.
pub const GIVEN_ENV: &str = "SHINYCTL_ZYGOTE_ENV";

/// The `-e` expression of the zygote's R: shiny loaded, and what its first
/// page loads (bslib, sass, jquerylib: 0.2 s of a copy's first request),
/// none of it an app's; a throwaway app's page asked of its own HTTP
/// handler, no socket (shiny's way from a request to a page runs, and R's
/// compiler compiles it, once here rather than in each claimed copy's first
/// request; the resource paths it registers are shiny's own folders, as
/// every app's page registers them, and nothing is left in the global
/// environment); then a full garbage collection, and the wait for claims in
/// `library` (fd 3 is its socket); in a claimed copy, the call returns and
/// R runs the copy's program.
///
/// The collection: the warm-up leaves R's heap near its next collection,
/// so each claimed copy collected in its first request, and a collection
/// in a fork writes the mark of every object it shares with the zygote,
/// copying each page (the fork's first page took 150–220 ms, 40–70 ms
/// after one collection here, which also raises R's threshold).
pub fn r_expr(library: &std::path::Path) -> String {
    format!(
        "suppressPackageStartupMessages(library(shiny)); \
         invisible(htmltools::renderTags(shiny::fluidPage(shiny::textOutput('o'), shiny::textInput('i', 'i')))); \
         local({{ a <- shiny::shinyApp(shiny::fluidPage(shiny::sliderInput('n', 'n', 1, 10, 5), shiny::plotOutput('p')), function(input, output) NULL); \
         invisible(try(a$httpHandler(list(REQUEST_METHOD = 'GET', PATH_INFO = '/', QUERY_STRING = '', HTTP_HOST = '127.0.0.1', \
         HEADERS = c(host = '127.0.0.1'))), silent = TRUE)) }}); \
         invisible(gc(full = TRUE)); dyn.load({}); invisible(.C('shinyctl_zygote', 3L)); \
         local({{ p <- Sys.getenv('{PROGRAM_ENV}'); Sys.unsetenv('{PROGRAM_ENV}'); eval(parse(text = p), envir = globalenv()) }})",
        super::r_string(&library.to_string_lossy())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zygote_collects_its_garbage_after_the_warm_up_and_before_it_waits() {
        let e = r_expr(std::path::Path::new("/opt/shinyctl/libshinyctl.so"));
        let (warm, gc, wait) = (e.find("renderTags").unwrap(), e.find("gc(full = TRUE)").unwrap(), e.find("shinyctl_zygote").unwrap());
        assert!(warm < gc && gc < wait, "{e}");
        let page = e.find("httpHandler").unwrap();
        assert!(warm < page && page < gc, "{e}");
    }
}
