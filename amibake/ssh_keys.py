"""Fresh SSH keys, made in process (ssh-keygen is a fork and milliseconds of CPU a key)."""

from __future__ import annotations


def ed25519() -> tuple[str, str]:
    """A new ed25519 key: its private half (OpenSSH PEM) and its public line (OpenSSH)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private, public
