// Package watch is the fleet page, GET /watch on the api role (DESIGN.md,
// "The fleet page"; docs/watch.md): nodes by state and site, GPUs by
// health, commands in flight and the latest events, rendered on the server
// with html/template from files embedded in the binary (no front-end build
// step) and kept current by a small embedded script that listens on
// GET /watch/events (Server-Sent Events) and re-fetches the live part of
// the page, GET /watch/fragment, when something changed.
//
// Login: GET /watch without a page session shows a form; POST /watch/login
// exchanges an API token of any role (viewer or higher) for a page session.
// The session lives in this process's memory (sessions below), its random
// id in an HttpOnly, SameSite=Strict cookie scoped to /watch (Secure under
// TLS), with an idle and an absolute lifetime; POST /watch/logout ends it.
// The cookie authorises the page, its fragment and its event stream only:
// the API never reads it. No token ever travels in a URL. A login is
// accepted only from the page's own origin (the Origin header, or
// Sec-Fetch-Site: same-origin), and logout also needs the session's form
// token.
//
// Every string that came from a node is escaped by html/template (no
// template.HTML of node data anywhere), and every response carries a strict
// Content-Security-Policy (self only: the script and style are files of
// their own, never inline) and X-Content-Type-Options: nosniff.
//
// Scale: the page shows counts (one grouped query, store.NodeCounts), the
// GPU health totals (a paged scan of the inventories, cached for
// Config.GPUCacheTTL) and one page of at most Config.PageSize nodes,
// filtered by state, with a cursor to the next: never one table of every
// node.
package watch
