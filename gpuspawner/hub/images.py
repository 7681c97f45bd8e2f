r"""Users' own images, within what admins allow.

A profile offers images with KubeSpawner's ``profile_options`` shape (kubespawner
``KubeSpawner.profile_list``, "profile_options"), so a site can carry its profile list over::

    "profile_options": {"image": {
        "display_name": "Image",
        "choices": {
            "pytorch": {"display_name": "PyTorch 2.4", "default": True,
                        "kubespawner_override": {"image": "registry.example.org/pytorch:2.4"}},
            "tf": {"display_name": "TensorFlow", "image": "registry.example.org/tf:2.16"},
        },
        "unlisted_choice": {"enabled": True, "display_name": "Other image",
                            "validation_regex": r"registry\.example\.org/[a-z0-9/._-]+",
                            "validation_message": "an image of registry.example.org"},
    }}

A choice names its image as ``image`` or as KubeSpawner's ``kubespawner_override: {image}``
(no other override key: a choice changes the image only). Users send the choice's key as
``user_options["image"]`` or, where ``unlisted_choice`` is enabled, a reference of their own as
``user_options["image--unlisted-choice"]`` (KubeSpawner's names; the form's fields are
``profile-option-<slug>--image`` and ``...--unlisted-choice``).

An unlisted reference must be a valid Docker image reference (the grammar of
distribution/reference, ``reference/regexp.go``: lowercase repository path, tag of at most
128 characters, optional digest) of at most :data:`MAX_REFERENCE` characters, match the
profile's ``validation_regex`` *as a whole* (``re.fullmatch``: a pattern cannot be escaped by
text before or after what it matched), and match none of the site's deny patterns
(``c.GPUSpawner.image_deny_patterns``, also matched in full, against the reference as written
and in its normalised form ``docker.io/library/ubuntu:latest``).

The normal form follows the engine's own rules (distribution/reference, ``normalize.go``,
``ParseNormalizedNamed`` / ``splitDockerDomain``): the first component is a registry when it
is ``localhost``, holds a ``.`` or a ``:``, or is not lowercase; otherwise the registry is
Docker Hub, ``docker.io``, whose other names ``index.docker.io`` and ``registry-1.docker.io``
map to it; a one-part name on Docker Hub gets ``library/``; no tag and no digest is
``:latest``. The registry host is lowercased (host names are not case-sensitive), an IP
address is written in its one canonical form (``127.1`` and ``0x7f.0.0.1`` are
``127.0.0.1``, ``[0:0::1]`` is ``[::1]``) and the port 443 (HTTPS's) is dropped. A reference is
ASCII only: Go's ``\w`` in the tag's pattern is ASCII, Python's is not.

An unlisted reference's registry may not be this host or the hub's and servers' networks
(:func:`check_registry`: loopback, link-local, ``0.0.0.0/8``, 198.18.0.0/15, ``localhost``,
``*.localhost``, this host's names) unless ``c.GPUSpawner.allowed_registries`` lists it: the
engine, which pulls as root on the node, would otherwise send requests for the user to the
hub's own services.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

__all__ = ["DEFAULT_REGISTRY", "REFUSED_NETWORKS", "REGISTRY_ALIASES", "ImageChoice",
           "ImageOption", "ImageOptionError", "ImageRequestError", "MAX_REFERENCE",
           "check_allowed_registries", "check_registry", "choose_image", "normalize_reference",
           "normalize_registry", "parse_image_option", "parse_reference", "refuse_networks",
           "registry_of"]

#: the longest unlisted reference accepted (characters)
MAX_REFERENCE = 255

#: Docker Hub's registry name in the normal form (distribution/reference normalize.go,
#: defaultDomain)
DEFAULT_REGISTRY = "docker.io"
#: Docker Hub's other names: normalize.go's legacyDefaultDomain, and the host its registry
#: answers on; each is ``docker.io`` in the normal form
REGISTRY_ALIASES = frozenset({"index.docker.io", "registry-1.docker.io"})
#: where a registry of users' own images may not be unless ``allowed_registries`` lists it:
#: loopback, link-local, "this host" (0.0.0.0/8, ::), and the hub's and servers' networks
#: (the project's range, 198.18.0.0/15: docker_network.DEFAULT_POOL, the hub network)
REFUSED_NETWORKS: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(
    ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10",
                                      "0.0.0.0/8", "::/128", "198.18.0.0/15"))
#: the hub's own server network pools, refused as well (:func:`refuse_networks`, at hub start)
_POOLS: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
#: names of this host whatever /etc/hosts says (RFC 6761 localhost, Debian's IPv6 names)
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                          "ip6-loopback"})

# distribution/reference, regexp.go (domain, path components, tag, digest); compiled with
# re.ASCII: Go's \w is [0-9A-Za-z_], Python's also matches "é"
_ALNUM = r"[a-z0-9]+"
_SEP = r"(?:[._]|__|[-]+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEP}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = (rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])"
           r"(?::[0-9]+)?")
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
_DOMAIN_RE = re.compile(_DOMAIN, re.ASCII)
#: an image ID: normalize.go refuses a name that is one (anchoredIdentifierRegexp)
_IDENTIFIER = re.compile(r"[a-f0-9]{64}", re.ASCII)
_NOT_A_REFERENCE = "is not a valid image reference (lowercase [registry/]path[:tag][@digest])"


class ImageRequestError(ValueError):
    """``user_options`` asking for an image the profile does not allow; ``field`` names the
    key (``image`` or ``image--unlisted-choice``). :func:`gpuspawner.hub.request.parse_request`
    turns it into an HTTP 400 naming the field."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


class ImageOptionError(ValueError):
    """A malformed ``profile_options.image`` or ``image_deny_patterns`` setting; the message
    names the field."""


@dataclass(frozen=True)
class ImageChoice:
    """One listed image: its key (``user_options["image"]``), what the form shows, the image
    reference, and whether it is the profile's default choice."""

    key: str
    display_name: str
    image: str
    default: bool = False


@dataclass(frozen=True)
class ImageOption:
    """A profile's ``profile_options.image``.

    Attributes:
        display_name: the form's label.
        choices: the listed images, in order.
        unlisted: users may type a reference of their own.
        unlisted_display_name: the form's label of that field.
        validation_regex: what an unlisted reference must match in full ("" = anything the
            deny patterns let through).
        validation_message: said when it does not.
    """

    display_name: str = "Image"
    choices: tuple[ImageChoice, ...] = ()
    unlisted: bool = False
    unlisted_display_name: str = "Other image"
    validation_regex: str = ""
    validation_message: str = ""
    _compiled: Any = field(default=None, compare=False, repr=False)

    def default_choice(self) -> ImageChoice | None:
        """The choice marked ``default``, else the first one, else None."""
        return next((c for c in self.choices if c.default), None) or (
            self.choices[0] if self.choices else None)


def parse_reference(text: str) -> dict[str, str | None]:
    """Split a Docker image reference into ``domain``, ``path``, ``tag``, ``digest`` (None
    where absent).

    Raises:
        ValueError: not a valid reference (distribution/reference's grammar), or longer than
            :data:`MAX_REFERENCE` characters.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("must be an image reference such as registry.example.org/team/"
                         "image:tag")
    if len(text) > MAX_REFERENCE:
        raise ValueError(f"is {len(text)} characters long; at most {MAX_REFERENCE}")
    if not text.isascii():
        raise ValueError(f"{text!r} {_NOT_A_REFERENCE}: only ASCII characters")
    if _IDENTIFIER.fullmatch(text):
        raise ValueError(f"{text!r} {_NOT_A_REFERENCE}: an image ID, not a name")
    m = _REFERENCE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} {_NOT_A_REFERENCE}")
    parts = m.groupdict()
    domain = parts["domain"]
    if domain and "." not in domain and ":" not in domain and domain != "localhost" \
            and domain.lower() == domain:
        # "team/image": a lowercase first component without "." or ":" is a path, not a
        # registry (splitDockerDomain); an upper-case one is a registry there
        if re.fullmatch(_COMPONENT, domain, re.ASCII) is None:
            raise ValueError(f"{text!r} {_NOT_A_REFERENCE}")
        parts["path"] = f"{domain}/{parts['path']}"
        parts["domain"] = None
    return parts


def _split_host(domain: str) -> tuple[str, str]:
    """``host[:port]`` (as the grammar took it) -> ``(host, port)``; port "" when absent."""
    if domain.startswith("["):
        end = domain.index("]")
        return domain[:end + 1], domain[end + 2:]
    host, _, port = domain.partition(":")
    return host, port


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a registry host is written as, or None for a name. An IPv4 address is
    read as the C library reads it (``inet_aton``: ``127.1``, ``0x7f.0.0.1``, ``2130706433``)
    since the engine's resolver may hand it there."""
    if host.startswith("["):
        try:
            return ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"[{host[1:-1]}] is not an IPv6 address") from None
    if re.fullmatch(r"[0-9a-fx.]+", host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def normalize_registry(domain: str | None) -> str:
    """A registry as the normal form writes it: ``None`` (none named) and Docker Hub's other
    names are ``docker.io``; the host lowercased, an IP address in its canonical form, the
    port 443 dropped (``Registry.Example.org:443`` is ``registry.example.org``).

    Raises:
        ValueError: not ``host[:port]`` of the reference grammar (distribution/reference's
            ``domainAndPort``), or a port past 65535.
    """
    if not domain:
        return DEFAULT_REGISTRY
    if not domain.isascii() or _DOMAIN_RE.fullmatch(domain) is None:
        raise ValueError(f"{domain!r} is not a registry (host[:port], ASCII)")
    host, port = _split_host(domain.lower())
    if port and int(port) > 65535:
        raise ValueError(f"{domain!r}: port {port} is past 65535")
    port = "" if not port or int(port) == 443 else str(int(port))
    address = _address(host)
    if isinstance(address, ipaddress.IPv6Address):
        host = f"[{address.compressed}]"
    elif address is not None:
        host = str(address)
    if host in REGISTRY_ALIASES and not port:
        host = DEFAULT_REGISTRY
    return f"{host}:{port}" if port else host


def registry_of(text: str) -> str:
    """The registry a reference names, normalised (:func:`normalize_registry`):
    ``ubuntu`` -> ``docker.io``, ``Index.Docker.io/x`` -> ``docker.io``.

    Raises:
        ValueError: as :func:`parse_reference`.
    """
    return normalize_registry(parse_reference(text)["domain"])


def normalize_reference(text: str) -> str:
    """The reference as the engine reads it: ``ubuntu`` -> ``docker.io/library/ubuntu:latest``,
    ``Index.Docker.io/x:1`` -> ``docker.io/library/x:1`` (the rules in the module's docstring).

    Raises:
        ValueError: as :func:`parse_reference`.
    """
    p = parse_reference(text)
    domain = normalize_registry(p["domain"])
    path = p["path"] or ""
    if domain == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    out = f"{domain}/{path}"
    if p["tag"] or not p["digest"]:
        out += f":{p['tag'] or 'latest'}"
    if p["digest"]:
        out += f"@{p['digest']}"
    return out


@lru_cache(maxsize=1)
def _own_names() -> frozenset[str]:
    """This host's names: :data:`_LOCAL_NAMES`, its host name (and the name's first label),
    and every name ``/etc/hosts`` gives an address in :data:`REFUSED_NETWORKS` (Debian's
    ``127.0.1.1 <host name>``). Read once; no DNS query (the hub's event loop calls this)."""
    names = set(_LOCAL_NAMES)
    host = socket.gethostname().lower()
    names |= {host, host.split(".")[0]}
    try:
        with open("/etc/hosts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address = ipaddress.ip_address(fields[0].split("%", 1)[0])
        except ValueError:
            continue
        if _refused_network(address) is not None:
            names |= {name.lower() for name in fields[1:]}
    return frozenset(names)


def refuse_networks(pools: Iterable[str]) -> None:
    """Refuse registries in the hub's server network pools too, beside
    :data:`REFUSED_NETWORKS` (a site's ``DockerBackend.server_network_pool`` or a node's
    ``network_pool`` outside 198.18.0.0/15). Called at hub start with the configured pools
    (comma-separated CIDR blocks; "" and blocks that do not parse are skipped: the pool's own
    check names them).
    """
    for text in pools:
        for block in str(text or "").split(","):
            try:
                network = ipaddress.ip_network(block.strip(), strict=False)
            except ValueError:
                continue
            if network not in _POOLS:
                _POOLS.append(network)
    _own_names.cache_clear()


def _refused_network(address: ipaddress.IPv4Address | ipaddress.IPv6Address
                     ) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The network of :data:`REFUSED_NETWORKS` or of the hub's pools
    (:func:`refuse_networks`) that holds ``address`` (an IPv4-mapped IPv6 address counts as
    its IPv4 address), or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return next((n for n in (*REFUSED_NETWORKS, *_POOLS)
                 if n.version == address.version and address in n), None)


def check_allowed_registries(value: Any, where: str = "GPUSpawner.allowed_registries"
                             ) -> frozenset[str]:
    """The site's ``allowed_registries``, normalised (:func:`normalize_registry`): each entry a
    registry ``host`` (any port) or ``host:port``.

    Raises:
        ImageOptionError: not a list of strings, or an entry that is not ``host[:port]``
            (named by its index).
    """
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise ImageOptionError(f"{where}: must be a list of registries (host or host:port)")
    out = set()
    for i, entry in enumerate(value):
        if not isinstance(entry, str):
            raise ImageOptionError(f"{where}[{i}]: must be a registry (host or host:port), "
                                   f"got {type(entry).__name__}")
        try:
            out.add(normalize_registry(entry))
        except ValueError as e:
            raise ImageOptionError(f"{where}[{i}]: {e}") from None
    return frozenset(out)


def check_registry(registry: str, allowed: Collection[str] = ()) -> None:
    """Refuse a registry of a user's own image that is this host or inside the hub's or the
    servers' networks, unless the admin listed it.

    Args:
        registry: the registry as :func:`normalize_registry` writes it.
        allowed: ``allowed_registries`` (:func:`check_allowed_registries`); an entry
            ``host`` allows every port of it, ``host:port`` that port.

    Raises:
        ValueError: the registry is ``localhost`` or ``*.localhost``, one of this host's
            names (its host name, a name ``/etc/hosts`` gives a refused address), or an
            address in :data:`REFUSED_NETWORKS`; the message names the registry and the
            setting, never anything the registry would answer.
    """
    host, _ = _split_host(registry)
    if registry in allowed or host in allowed:
        return
    address = _address(host)
    if address is None:
        if host.endswith(".localhost") or host in _own_names():
            why = "a name of the hub's own host"
        else:
            return
    else:
        network = _refused_network(address)
        if network is None:
            return
        why = f"an address in {network}, the hub's own host or its servers' networks"
    raise ValueError(f"registry {registry!r} is {why}; images are not pulled from there "
                     "unless an admin lists it in c.GPUSpawner.allowed_registries")


def _compile(pattern: Any, where: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise ImageOptionError(f"{where}: must be a regular expression (a string), got "
                               f"{type(pattern).__name__}")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ImageOptionError(f"{where}: not a regular expression: {e}") from None


def check_deny_patterns(patterns: Any, where: str = "GPUSpawner.image_deny_patterns"
                        ) -> tuple[re.Pattern[str], ...]:
    """The site's deny list, compiled.

    Raises:
        ImageOptionError: not a list of strings, or a pattern that does not compile.
    """
    if not isinstance(patterns, (list, tuple)):
        raise ImageOptionError(f"{where}: must be a list of regular expressions")
    return tuple(_compile(p, f"{where}[{i}]") for i, p in enumerate(patterns))


def parse_image_option(value: Any, where: str) -> ImageOption:
    """Read a profile's ``profile_options.image`` (the shape in the module's docstring).

    Raises:
        ImageOptionError: a missing image, an override key other than ``image``, a listed
            image that is not a valid reference, more than one default, a validation_regex
            that does not compile, or nothing to choose (no choices and no unlisted choice).
    """
    if not isinstance(value, Mapping):
        raise ImageOptionError(f"{where}: must be a dict with choices and/or unlisted_choice")
    choices = []
    for key, c in (value.get("choices") or {}).items():
        at = f"{where}.choices.{key}"
        if not isinstance(c, Mapping):
            raise ImageOptionError(f"{at}: must be a dict with display_name and image")
        override = c.get("kubespawner_override") or {}
        extra = set(override) - {"image"}
        if extra:
            raise ImageOptionError(f"{at}.kubespawner_override: only image may be set here, "
                                   f"got {sorted(extra)[0]!r}")
        image = c.get("image") or override.get("image")
        if not image:
            raise ImageOptionError(f"{at}: names no image (image, or kubespawner_override."
                                   "image)")
        try:
            parse_reference(image)
        except ValueError as e:
            raise ImageOptionError(f"{at}.image: {e}") from None
        choices.append(ImageChoice(str(key), str(c.get("display_name") or key), image,
                                   bool(c.get("default", False))))
    if sum(c.default for c in choices) > 1:
        raise ImageOptionError(f"{where}.choices: more than one has default: true")
    unlisted = value.get("unlisted_choice") or {}
    enabled = bool(unlisted.get("enabled", False))
    regex = unlisted.get("validation_regex") or ""
    compiled = _compile(regex, f"{where}.unlisted_choice.validation_regex") if regex else None
    if not choices and not enabled:
        raise ImageOptionError(f"{where}: offers nothing: give choices or enable "
                               "unlisted_choice")
    return ImageOption(display_name=str(value.get("display_name") or "Image"),
                       choices=tuple(choices), unlisted=enabled,
                       unlisted_display_name=str(unlisted.get("display_name")
                                                 or "Other image"),
                       validation_regex=regex,
                       validation_message=str(unlisted.get("validation_message") or ""),
                       _compiled=compiled)


#: the user_options keys of the image option (KubeSpawner's names)
IMAGE_KEY = "image"
UNLISTED_KEY = "image--unlisted-choice"


def choose_image(options: Mapping[str, Any], option: ImageOption | None, slug: str,
                 deny: Sequence[re.Pattern[str]] = (),
                 allowed_registries: Collection[str] = ()) -> tuple[str, bool]:
    """The image ``options`` ask for on a profile offering ``option``.

    An unlisted reference must parse (ASCII, the reference grammar), name a registry that
    :func:`check_registry` lets through (``allowed_registries``: normalised, as
    :func:`check_allowed_registries` returns them), match the profile's
    ``validation_regex`` as typed or in its normal form, and no deny pattern in either form.

    Returns:
        ``(image, unlisted)``: the reference ("" = the profile's own image) and whether the
        user typed it (the hub then checks it on the node before booking anything).

    Raises:
        ImageRequestError: field ``image`` (the profile offers no choice, an unknown choice) or
            ``image--unlisted-choice`` (not offered, not a reference, a registry on the
            hub's own host or networks, outside the profile's pattern, on the site's deny
            list).
    """
    key, text = options.get(IMAGE_KEY), options.get(UNLISTED_KEY)
    if option is None:
        if key is not None or text is not None:
            field = IMAGE_KEY if key is not None else UNLISTED_KEY
            raise ImageRequestError(field, f"profile {slug!r} offers no choice of image")
        return "", False
    if text is not None and text != "":
        if not option.unlisted:
            raise ImageRequestError(UNLISTED_KEY, f"profile {slug!r} offers only its listed "
                                    f"images: {', '.join(c.key for c in option.choices)}")
        try:
            normal = normalize_reference(text)
            check_registry(registry_of(text), allowed_registries)
        except ValueError as e:
            raise ImageRequestError(UNLISTED_KEY, str(e)) from None
        if option._compiled is not None and option._compiled.fullmatch(text) is None \
                and option._compiled.fullmatch(normal) is None:
            raise ImageRequestError(UNLISTED_KEY, f"{text!r} is not allowed on profile {slug!r}: "
                                             + (option.validation_message or
                                                f"it must match {option.validation_regex}"))
        for pattern in deny:
            if pattern.fullmatch(text) or pattern.fullmatch(normal):
                raise ImageRequestError(UNLISTED_KEY, f"{text!r} is not allowed on this hub "
                                                 f"(image_deny_patterns: {pattern.pattern})")
        return text, True
    if key is None:
        default = option.default_choice()
        return (default.image if default else ""), False
    match = next((c for c in option.choices if c.key == key), None)
    if match is None:
        names = ", ".join(c.key for c in option.choices) or "none"
        raise ImageRequestError(IMAGE_KEY, f"unknown image {key!r} for profile {slug!r}; choose "
                                      f"one of: {names}")
    return match.image, False
