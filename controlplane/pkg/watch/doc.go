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
// The cookie authorises the page, its fragment, its event stream and the
// page's own actions only: the API never reads it. No token ever travels in a URL. A login is
// accepted only from the page's own origin (the Origin header, or
// Sec-Fetch-Site: same-origin), and logout also needs the session's form
// token.
//
// Actions (actions.go, preview.go): a session whose role allows it cordons,
// drains, orders repairs, returns cases, pauses, resumes or aborts rollouts
// and resets breakers from the page, each first previewed against its
// pool's disruption budget (store.Admission, the rule admission applies)
// and then carried out by Config.Actions, the API's own method called as
// the session's token (its role check, handler and audit row: the page keeps
// no rule of its own). An action needs the session's form token in the
// X-Watch-CSRF header and the page's origin besides the cookie. The shell
// page runs xterm.js (assets/xterm, vendored unchanged) over the API's own
// tunnel.
//
// Every string that came from a node is escaped by html/template (no
// template.HTML of node data anywhere), and every response carries a strict
// Content-Security-Policy (scripts and connections from the origin only;
// styles from it, or a <style> element with the response's own nonce, which
// only the terminal's script uses) and X-Content-Type-Options: nosniff.
//
// Scale: the page shows counts (one grouped query, store.NodeCounts), the
// GPU health totals (a paged scan of the inventories, cached for
// Config.GPUCacheTTL) and one page of at most Config.PageSize nodes,
// filtered by state, with a cursor to the next: never one table of every
// node.
package watch
