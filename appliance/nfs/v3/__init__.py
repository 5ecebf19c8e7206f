"""NFSv3 (RFC 1813) and MOUNT v3: XDR declarations and protocol numbers (types), the
call context and status codes (context), the procedures (procedures), program 100003
version 3 (program) and program 100005 (mount)."""
