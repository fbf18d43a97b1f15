# hello: the example app for shinyctl.
#
# Run it with shinyctl:
#   shinyctl apply -f examples/hello/app.yaml     # then open http://localhost:8765
# or on its own:
#   R --no-echo --no-restore -e "shiny::runApp('app.R', port=20555, launch.browser=FALSE)"
#
# shinyctl starts each copy with SHINYCTL_COPY=N (the copy's number) and
# SHINYCTL_SCRATCH=<the copy's own folder>; the page shows which copy served it.

library(shiny)

copy <- Sys.getenv("SHINYCTL_COPY")
copy_label <- if (nzchar(copy)) paste("copy", copy) else "copy ? (not started by shinyctl)"
started <- format(Sys.time(), "%Y-%m-%dT%H:%M:%S%z")

# After its copy changes (the copy died, or a redeploy stopped it), an open
# Shiny page greys out. This script waits for the app to answer again, then
# reloads the page, which brings the visitor onto a copy that is running.
# Copy it into your own app's UI. (shiny's session$allowReconnect("force") is
# no substitute: a page reconnected to a new R process keeps its old outputs.)
reload_when_back <- tags$script(HTML("
(function () {
  var polling = false;
  $(document).on('shiny:disconnected', function () {
    if (polling) return;
    polling = true;
    var url = window.location.href.split('#')[0];
    var poll = function () {
      fetch(url, { cache: 'no-store', credentials: 'same-origin' })
        .then(function (response) {
          if (response.status === 200) {
            window.location.reload();
          } else {
            setTimeout(poll, 1000);
          }
        })
        .catch(function () { setTimeout(poll, 1000); });
    };
    setTimeout(poll, 1000);
  });
})();
"))

ui <- fluidPage(
  tags$head(reload_when_back),
  titlePanel("hello"),
  sidebarLayout(
    sidebarPanel(
      sliderInput("n", "Number of points", min = 10, max = 1000, value = 200, step = 10),
      p("Served by ", strong(textOutput("copy", inline = TRUE)),
        " (R process ", textOutput("pid", inline = TRUE), ", started ", started, ")")
    ),
    mainPanel(
      plotOutput("plot", height = "320px"),
      textOutput("summary")
    )
  )
)

server <- function(input, output, session) {
  output$copy <- renderText(copy_label)
  output$pid <- renderText(Sys.getpid())

  points <- reactive(rnorm(input$n))

  output$plot <- renderPlot({
    hist(points(), breaks = 30, col = "grey80", border = "white",
         main = paste(input$n, "draws from N(0, 1)"), xlab = NULL)
  })

  output$summary <- renderText({
    x <- points()
    sprintf("n = %d, mean = %.3f, sd = %.3f", length(x), mean(x), sd(x))
  })
}

shinyApp(ui, server)
