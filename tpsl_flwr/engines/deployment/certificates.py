"""Local TLS certificates and SuperNode key pairs, for trying things locally.

Flower 1.42 secures a deployment with two separate mechanisms:

* **TLS** between every client and the SuperLink: ``flower-superlink
  --ssl-ca-certfile CA --ssl-certfile CERT --ssl-keyfile KEY`` serves its one
  HTTPS port (Fleet, Control and Runtime APIs), and clients verify it with
  the CA certificate (``flower-supernode --root-certificates CA``, the
  ``root-certificates`` key of a connection in ``$FLWR_HOME/config.toml``).
  All three files are PEM (certificates X.509, the key PKCS#8).
* **SuperNode authentication** (``flower-superlink --enable-supernode-auth``):
  each SuperNode signs its requests with an ECDSA key on a NIST curve; the
  private key is read with ``load_ssh_private_key`` (``flower-supernode
  --auth-supernode-private-key``, OpenSSH format) and the public key with
  ``load_ssh_public_key`` (``flwr supernode register PUBLIC_KEY``, one
  ``ecdsa-sha2-nistp384 ...`` line), as ``ssh-keygen -t ecdsa -b 384`` writes
  them.

:func:`create_local_certificates` writes all of it with the ``cryptography``
package: a self-signed CA, a SuperLink certificate for ``127.0.0.1``,
``::1`` and ``localhost`` signed by it, and one ECDSA SECP384R1 key pair per
SuperNode. It is meant for loopback tests and local experiments only: real
deployments use their own PKI (their CA, certificates for their host names,
keys generated and kept on each SuperNode's machine).

Command line::

    python -m tpsl_flwr.engines.deployment.certificates OUT_DIR --supernodes N
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tpsl_flwr._util.private_files import (
    FILE_MODE,
    PUBLIC_MODE,
    private_folder,
    write_atomic,
)

__all__ = [
    "LocalCertificates",
    "SuperNodeKeyPair",
    "create_local_certificates",
    "create_supernode_key_pair",
    "load_local_certificates",
    "main",
]

CA_CERTFILE = "ca.crt"
CA_KEYFILE = "ca.key"
SERVER_CERTFILE = "server.pem"
SERVER_KEYFILE = "server.key"
SERVER_HOSTS = ("127.0.0.1", "::1", "localhost")
"""Names the SuperLink certificate is valid for (loopback only)."""

_CURVE = ec.SECP384R1()


@dataclass(frozen=True)
class SuperNodeKeyPair:
    """Paths of one SuperNode's authentication key pair.

    Attributes
    ----------
    private_key : Path
        OpenSSH private key (``--auth-supernode-private-key``), mode 0600.
    public_key : Path
        OpenSSH public key line (``flwr supernode register``).
    """

    private_key: Path
    public_key: Path


@dataclass(frozen=True)
class LocalCertificates:
    """Paths of a local CA, the SuperLink's certificate and SuperNode keys.

    Attributes
    ----------
    directory : Path
        The folder holding everything (mode 0700).
    ca_certfile : Path
        CA certificate, PEM (``--ssl-ca-certfile``, ``--root-certificates``).
    server_certfile : Path
        SuperLink certificate, PEM (``--ssl-certfile``).
    server_keyfile : Path
        SuperLink private key, PEM PKCS#8 (``--ssl-keyfile``), mode 0600.
    supernodes : tuple[SuperNodeKeyPair, ...]
        One authentication key pair per SuperNode.
    """

    directory: Path
    ca_certfile: Path
    server_certfile: Path
    server_keyfile: Path
    supernodes: tuple[SuperNodeKeyPair, ...]

    def superlink_args(self) -> list[str]:
        """``flower-superlink`` TLS arguments for these files."""
        return [
            "--ssl-ca-certfile",
            str(self.ca_certfile),
            "--ssl-certfile",
            str(self.server_certfile),
            "--ssl-keyfile",
            str(self.server_keyfile),
        ]


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tpsl-flwr local test"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_usage(*, signature: bool, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def create_supernode_key_pair(
    private_key: Path, public_key: Path | None = None
) -> SuperNodeKeyPair:
    """Write one SuperNode authentication key pair (ECDSA SECP384R1, OpenSSH).

    The same formats as ``ssh-keygen -t ecdsa -b 384 -N "" -f PRIVATE_KEY``:
    what ``flower-supernode --auth-supernode-private-key`` and ``flwr
    supernode register`` read in Flower 1.42.

    Parameters
    ----------
    private_key : Path
        Where to write the unencrypted OpenSSH private key (mode 0600); its
        folder must exist.
    public_key : Path | None
        Where to write the public key line; ``<private_key>.pub`` if ``None``.

    Returns
    -------
    SuperNodeKeyPair
        The two paths.
    """
    private_key = Path(private_key)
    public_key = (
        private_key.with_name(private_key.name + ".pub")
        if public_key is None
        else Path(public_key)
    )
    key = ec.generate_private_key(_CURVE)
    write_atomic(
        private_key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
        mode=FILE_MODE,
    )
    line = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    write_atomic(public_key, line + b"\n", mode=PUBLIC_MODE)
    return SuperNodeKeyPair(private_key=private_key, public_key=public_key)


def _supernode_paths(directory: Path, index: int) -> SuperNodeKeyPair:
    private = directory / f"supernode-{index}"
    return SuperNodeKeyPair(private, private.with_name(private.name + ".pub"))


def create_local_certificates(
    out_dir: Path,
    num_supernodes: int,
    *,
    valid_days: int = 30,
) -> LocalCertificates:
    """Create a local CA, a SuperLink certificate and SuperNode key pairs.

    For loopback tests and trying things locally only; real deployments use
    their own PKI. Existing files of the same names are replaced.

    Files written into ``out_dir`` (created with mode 0700; private keys 0600):

    * ``ca.crt``/``ca.key``: a self-signed ECDSA SECP384R1 CA;
    * ``server.pem``/``server.key``: the SuperLink's certificate, signed by
      the CA, for ``127.0.0.1``, ``::1`` and ``localhost``, and its key
      (PEM, PKCS#8);
    * ``supernode-<i>``/``supernode-<i>.pub`` for ``i`` in
      ``range(num_supernodes)``: OpenSSH ECDSA SECP384R1 key pairs
      (:func:`create_supernode_key_pair`).

    Parameters
    ----------
    out_dir : Path
        Output folder.
    num_supernodes : int
        Number of SuperNode key pairs (``>= 0``).
    valid_days : int
        Validity of the certificates, from one hour ago.

    Returns
    -------
    LocalCertificates
        Paths of everything written.

    Raises
    ------
    ValueError
        If ``num_supernodes < 0`` or ``valid_days < 1``.
    """
    if num_supernodes < 0:
        raise ValueError(f"num_supernodes must be >= 0, got {num_supernodes}")
    if valid_days < 1:
        raise ValueError(f"valid_days must be >= 1, got {valid_days}")
    directory = private_folder(Path(out_dir).expanduser())
    now = dt.datetime.now(dt.timezone.utc)
    not_before = now - dt.timedelta(hours=1)
    not_after = now + dt.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(_CURVE)
    ca_name = _name("tpsl-flwr local CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signature=True, cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(_CURVE)
    alt_names: list[x509.GeneralName] = []
    for host in SERVER_HOSTS:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
        .add_extension(_key_usage(signature=True, cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA384())
    )

    pem = serialization.Encoding.PEM
    write_atomic(directory / CA_KEYFILE, _pem_key(ca_key), mode=FILE_MODE)
    write_atomic(directory / CA_CERTFILE, ca_cert.public_bytes(pem), mode=PUBLIC_MODE)
    write_atomic(directory / SERVER_KEYFILE, _pem_key(server_key), mode=FILE_MODE)
    write_atomic(
        directory / SERVER_CERTFILE, server_cert.public_bytes(pem), mode=PUBLIC_MODE
    )
    pairs = tuple(
        create_supernode_key_pair(_supernode_paths(directory, i).private_key)
        for i in range(num_supernodes)
    )
    return LocalCertificates(
        directory=directory,
        ca_certfile=directory / CA_CERTFILE,
        server_certfile=directory / SERVER_CERTFILE,
        server_keyfile=directory / SERVER_KEYFILE,
        supernodes=pairs,
    )


def load_local_certificates(directory: Path, num_supernodes: int) -> LocalCertificates:
    """The paths of files written by :func:`create_local_certificates`.

    Parameters
    ----------
    directory : Path
        Folder passed to :func:`create_local_certificates`.
    num_supernodes : int
        Number of SuperNode key pairs needed.

    Returns
    -------
    LocalCertificates
        Paths of the CA, the SuperLink's files and the first
        ``num_supernodes`` key pairs.

    Raises
    ------
    FileNotFoundError
        If one of these files is missing.
    """
    directory = Path(directory).expanduser().resolve()
    pairs = tuple(_supernode_paths(directory, i) for i in range(num_supernodes))
    found = LocalCertificates(
        directory=directory,
        ca_certfile=directory / CA_CERTFILE,
        server_certfile=directory / SERVER_CERTFILE,
        server_keyfile=directory / SERVER_KEYFILE,
        supernodes=pairs,
    )
    needed = [found.ca_certfile, found.server_certfile, found.server_keyfile]
    needed += [path for pair in pairs for path in (pair.private_key, pair.public_key)]
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"missing certificate/key files: {missing}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m tpsl_flwr.engines.deployment.certificates OUT_DIR``.

    Parameters
    ----------
    argv : Sequence[str] | None
        Arguments (``sys.argv[1:]`` if ``None``).

    Returns
    -------
    int
        Exit status (0).
    """
    parser = argparse.ArgumentParser(
        prog="python -m tpsl_flwr.engines.deployment.certificates",
        description=(
            "Create a local CA, a SuperLink TLS certificate for 127.0.0.1/"
            "localhost and SuperNode authentication key pairs for Flower 1.42. "
            "For local tests only: real deployments use their own PKI."
        ),
    )
    parser.add_argument("out_dir", type=Path, help="output folder (mode 0700)")
    parser.add_argument(
        "--supernodes", type=int, default=2, help="number of SuperNode key pairs"
    )
    parser.add_argument(
        "--valid-days", type=int, default=30, help="certificate validity in days"
    )
    args = parser.parse_args(argv)
    certs = create_local_certificates(
        args.out_dir, args.supernodes, valid_days=args.valid_days
    )
    print(f"CA certificate:      {certs.ca_certfile}")
    print(f"SuperLink cert/key:  {certs.server_certfile} {certs.server_keyfile}")
    for i, pair in enumerate(certs.supernodes):
        print(f"SuperNode {i} keys:    {pair.private_key} {pair.public_key}")
    print(
        "flower-superlink "
        + " ".join(certs.superlink_args())
        + " --enable-supernode-auth"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
