"""NFSv4.1 (RFC 8881): protocol numbers (const), XDR declarations (types), file
attributes (attrs), clients/sessions/stateids/locks (state), the operation table
(registry), the COMPOUND context (context) and executor (compound), the operations by
area (ops/), and program 100003 version 4 (program)."""
