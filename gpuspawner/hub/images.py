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
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ImageChoice", "ImageOption", "ImageOptionError", "ImageRequestError", "MAX_REFERENCE",
           "choose_image", "normalize_reference", "parse_image_option", "parse_reference"]

#: the longest unlisted reference accepted (characters)
MAX_REFERENCE = 255

# distribution/reference, reference/regexp.go (domain, path components, tag, digest)
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
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")


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
    m = _REFERENCE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a valid image reference (lowercase "
                         "[registry/]path[:tag][@digest])")
    parts = m.groupdict()
    domain = parts["domain"]
    if domain and "." not in domain and ":" not in domain and domain != "localhost" \
            and not domain.startswith("["):
        # "team/image": the first component is a path, not a registry (Docker's rule)
        if re.fullmatch(_COMPONENT, domain) is None:
            raise ValueError(f"{text!r} is not a valid image reference (lowercase "
                             "[registry/]path[:tag][@digest])")
        parts["path"] = f"{domain}/{parts['path']}"
        parts["domain"] = None
    return parts


def normalize_reference(text: str) -> str:
    """The reference as the engine reads it: ``ubuntu`` -> ``docker.io/library/ubuntu:latest``.

    Raises:
        ValueError: as :func:`parse_reference`.
    """
    p = parse_reference(text)
    domain = p["domain"] or "docker.io"
    path = p["path"] or ""
    if domain == "docker.io" and "/" not in path:
        path = f"library/{path}"
    out = f"{domain}/{path}"
    if p["tag"] or not p["digest"]:
        out += f":{p['tag'] or 'latest'}"
    if p["digest"]:
        out += f"@{p['digest']}"
    return out


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
                 deny: Sequence[re.Pattern[str]] = ()) -> tuple[str, bool]:
    """The image ``options`` ask for on a profile offering ``option``.

    Returns:
        ``(image, unlisted)``: the reference ("" = the profile's own image) and whether the
        user typed it (the hub then checks it on the node before booking anything).

    Raises:
        ImageRequestError: field ``image`` (the profile offers no choice, an unknown choice) or
            ``image--unlisted-choice`` (not offered, not a reference, outside the profile's
            pattern, on the site's deny list).
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
        except ValueError as e:
            raise ImageRequestError(UNLISTED_KEY, str(e)) from None
        if option._compiled is not None and option._compiled.fullmatch(text) is None:
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
