"""The chat page `runner serve` answers GET / with: its static files (static/, served from the
package, nothing from elsewhere) and the small conversation API under /runner/v1/ over runner's one
conversation store, the same `runner chat`, `runner run -c` and `runner history` use."""
