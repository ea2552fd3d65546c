"""Container image references, and a tag's digest from its registry.

A rollout names images by digest (`registry/repo@sha256:...`): a tag can be moved to
another build after the canaries passed, a digest cannot. A tag is resolved once, at
deploy time, with the registry HTTP API (`HEAD /v2/<name>/manifests/<tag>`, whose
`Docker-Content-Digest` is the manifest's or the multi-platform index's digest).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from edgefleet.shared.errors import EdgefleetError, InvalidInput

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*(?::[0-9]+)?)"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST_PATTERN = r"sha256:[a-f0-9]{64}"
_REF_RE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{DIGEST_PATTERN}))?$"
)
# what a registry may answer for one name: a multi-platform index first (a Jetson and an
# x86 host pull their own platform from it), then single manifests
MANIFEST_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RegistryUnavailable(EdgefleetError):
    """The registry a tag names did not answer with a digest (down, refused, no such tag)."""

    code = "registry_unavailable"
    http_status = 424


@dataclass(frozen=True)
class ImageRef:
    domain: str | None
    path: str
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    def pinned(self, digest: str) -> str:
        """`repository@digest`: the form desired states carry."""
        return f"{self.repository}@{digest}"


def parse_image(image: str) -> ImageRef:
    """An image reference with an explicit tag or digest; InvalidInput otherwise."""
    match = _REF_RE.match(image)
    if not match or not (match["tag"] or match["digest"]):
        raise InvalidInput(
            f"image {image!r} is not a reference with a tag or digest, "
            "e.g. registry.example:5000/acme/edge:1.4.2 or ...@sha256:<64 hex>"
        )
    return ImageRef(match["domain"], match["path"], match["tag"], match["digest"])


def is_pinned(image: str) -> bool:
    """Whether `image` is exactly `repository@sha256:...` (no tag beside the digest)."""
    ref = parse_image(image)
    return ref.digest is not None and ref.tag is None


def registry_base(domain: str) -> str:
    """The registry's API base: plain http only to this host, https everywhere else."""
    host = domain.rsplit(":", 1)[0] if domain.count(":") == 1 else domain
    scheme = "http" if host in _LOOPBACK else "https"
    return f"{scheme}://{domain}/v2"


def resolve_digest(image: str, http: httpx.Client | None = None) -> str:
    """`image` as `repository@sha256:...`; a tag is asked of its registry once.

    A reference with both a tag and a digest keeps the digest (as docker does).
    """
    ref = parse_image(image)
    if ref.digest:
        return ref.pinned(ref.digest)
    if ref.domain is None or not (
        "." in ref.domain or ":" in ref.domain or ref.domain == "localhost"
    ):
        raise InvalidInput(
            f"image {image!r} names no registry: give registry/name:tag, or a digest"
        )
    client = http or httpx.Client(timeout=httpx.Timeout(15.0, connect=5.0))
    url = f"{registry_base(ref.domain)}/{ref.path}/manifests/{ref.tag}"
    headers = {"Accept": MANIFEST_ACCEPT}
    try:
        resp = client.head(url, headers=headers)
        if resp.status_code == 401:
            token = _anonymous_token(client, resp.headers.get("www-authenticate", ""), ref.path)
            if token:
                resp = client.head(url, headers={**headers, "Authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        raise RegistryUnavailable(
            f"registry {ref.domain} did not answer for {image}: {exc}"
        ) from None
    finally:
        if http is None:
            client.close()
    digest = resp.headers.get("docker-content-digest", "")
    if resp.status_code != 200 or not re.fullmatch(DIGEST_PATTERN, digest):
        raise RegistryUnavailable(
            f"registry {ref.domain} has no digest for {image} (HTTP {resp.status_code})"
        )
    return ref.pinned(digest)


def _anonymous_token(client: httpx.Client, challenge: str, path: str) -> str | None:
    """A pull token from a registry's Bearer challenge, asked for without credentials."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if not challenge.lower().startswith("bearer") or "realm" not in params:
        return None
    query = {"service": params.get("service", ""), "scope": f"repository:{path}:pull"}
    resp = client.get(params["realm"], params=query)
    if resp.status_code != 200:
        return None
    body = resp.json()
    token = body.get("token") or body.get("access_token")
    return token if isinstance(token, str) else None
