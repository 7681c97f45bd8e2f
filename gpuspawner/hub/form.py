"""The spawn form: one card per profile with live availability, quota and group permission,
rendered with Jinja2 (``templates/profiles.html.j2``, overridable through
``GPUSpawner.additional_template_paths``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, select_autoescape
from tornado import web
from traitlets import Bool, HasTraits, List, Unicode, default

from ..gpushare.words import share_text
from ..placement import GPU, GPU_MILLI, Bundle, Ledger, Node, QuotaTable, format_bytes
from ..placement.devices import model_allowed
from ..placement.units import share_words
from ..usage.budgets import EXEMPT_SCOPE, budget_status, warning_text
from .images import ImageOptionError, check_allowed_registries, check_deny_patterns
from .profiles import OptionsError, Profile, ProfileConfigError, load_profiles
from .request import ServerRequest, checked_request, quota_table
from .user_options import pending_refusal, watch_spawn


def plural(n: float, word: str, words: str | None = None) -> str:
    """``"1 core"``, ``"2 cores"``, ``"0.5 cores"`` (English plural: only exactly 1 is
    singular)."""
    return f"{n:g} {word if n == 1 else (words or word + 's')}"


def size_text(n: int) -> str:
    """Memory or disk in binary units without a needless ``.0``: ``"64 GiB"``, ``"1.5 GiB"``,
    ``"512 MiB"`` (same units as :func:`~gpuspawner.placement.format_bytes`)."""
    return format_bytes(n).replace(".0 ", " ")


def gpu_memory_text(n: int) -> str:
    """GPU memory as vendors name it: whole GB of 2**30 bytes (NVML's 81920 MiB of an
    "A100 80GB" -> ``"80 GB"``)."""
    return f"{round(n / 2**30)} GB" if n else ""


def _matching_gpus(nodes: Iterable[Node], bundle: Bundle) -> list[GPU]:
    return [g for n in nodes for g in n.gpus if model_allowed(g, bundle)]


def resources_line(bundle: Bundle, nodes: Sequence[Node] = ()) -> str:
    """One line for a card: GPU count and model with its memory, cores, memory, disk, e.g.
    ``"1 x A100 80 GB · 8 cores · 64 GiB memory · 50 GiB disk"``; a share reads
    ``"¼ of a shared GPU · 1 core · 4 GiB memory"``. GPU memory comes from ``nodes``' GPUs of
    the allowed models (several sizes: ``"40/80 GB"``; none known: left out)."""
    parts = []
    if bundle.total_gpu_milli:
        matching = _matching_gpus(nodes, bundle)
        model = "/".join(bundle.gpu_models)
        sizes = sorted({g.memory_bytes for g in matching if g.memory_bytes})
        mem = "/".join(gpu_memory_text(m).removesuffix(" GB") for m in sizes)
        what = " ".join(x for x in (model, f"{mem} GB" if mem else "") if x)
        if bundle.mig:
            on = f" on {model}" if model else ""
            parts.append(f"{bundle.mig_count} x MIG {bundle.mig}{on}")
        elif bundle.gpus:
            parts.append(f"{bundle.gpus} x {what}" if what else plural(bundle.gpus, "GPU"))
        else:
            share = share_words(bundle.gpu_milli)
            parts.append(f"{share} of a shared {what or 'GPU'}")
    parts.append(plural(bundle.cores, "core"))
    if bundle.memory_bytes:
        parts.append(f"{size_text(bundle.memory_bytes)} memory")
    if bundle.disk_bytes:
        parts.append(f"{size_text(bundle.disk_bytes)} disk")
    return " · ".join(parts)




def share_line(profile: Profile, nodes: Sequence[Node],
               mechanisms: Mapping[str, str] | None = None) -> str:
    """What a GPU share of ``profile`` gives and what holds it on the nodes it may land on
    (:func:`gpuspawner.gpushare.words.share_text`), e.g. ``"1/4 of an A100 80GB: 20 GiB of GPU
    memory, compute time shared; held by the kernel (...)"``; "" for a profile without a share
    (whole GPUs, MIG, none) or without a shareable GPU of its models.

    ``mechanisms``: node name -> the node's share mechanism (the cluster's
    ``NodeRuntime.gpu_share.name``); None: the holder is not said.
    """
    b = profile.bundle
    if not b.gpu_milli or b.gpus or b.mig:
        return ""
    usable = [n for n in nodes if not profile.nodes or n.name in profile.nodes]
    on = [(n.name, g) for n in usable for g in n.gpus if g.shareable and model_allowed(g, b)]
    if not on:
        return ""
    sizes = [g.memory_bytes * b.gpu_milli // GPU_MILLI for _, g in on if g.memory_bytes]
    models = sorted({g.model for _, g in on if g.model})
    model = "/".join(b.gpu_models) or (models[0] if len(models) == 1 else "")
    totals = sorted({g.memory_bytes for _, g in on if g.memory_bytes})
    if model and totals:  # as the card's first line: "A100 80 GB", "A100 40/80 GB"
        model += " " + "/".join(gpu_memory_text(t).removesuffix(" GB") for t in totals) + " GB"
    held = {name: mechanisms[name] for name, _ in on if mechanisms and name in mechanisms}
    return share_text(b.gpu_milli, sizes, model, held)


def never_reason(profile: Profile, nodes: Sequence[Node]) -> str:
    """Why the profile can never start on this hub, even with every node empty ("" when it
    can): no GPU of its models, no shareable one for a share, or no node large enough
    (cores, memory, GPUs) among the nodes it may use. Disk is not judged (a node may not
    know its disk size)."""
    b = profile.bundle
    usable = [n for n in nodes if not profile.nodes or n.name in profile.nodes]
    models = "/".join(b.gpu_models) or "GPU"
    if b.total_gpu_milli:
        matching = _matching_gpus(usable, b)
        if not matching:
            return f"no {models} on this hub"
        if b.gpu_milli and not any(g.shareable for g in matching):
            return f"no shared {models} on this hub"
        if b.mig and not any(m.profile == b.mig for g in matching for m in g.mig):
            return f"no MIG {b.mig} instance on this hub"
    for n in usable:
        gpus = _matching_gpus([n], b)
        if b.gpu_milli:
            gpus = [g for g in gpus if g.shareable][:1]
        if b.mig:  # MIG instances of the profile count as the devices
            gpus = [g for g in gpus for m in g.mig if m.profile == b.mig]
        elif b.gpus:
            gpus = [g for g in gpus if not g.mig_enabled]
        if (n.cpu_count >= b.cores and n.memory_bytes >= b.memory_bytes
                and len(gpus) >= (b.gpus or (1 if b.gpu_milli else b.mig_units))):
            return ""
    return "larger than any node of this hub"


def _startable(ledger: Ledger, bundle: Any, nodes: Sequence[str]) -> bool:
    """Whether an elastic node that is off (can start, :mod:`gpuspawner.elastic`) within
    ``nodes`` (empty: any) could hold ``bundle``."""
    return any(ledger.could_hold(bundle, n) for n in ledger.startable_nodes()
               if not nodes or n in nodes)


def profile_cards(profiles: Sequence[Profile], ledger: Ledger, user: str,
                  groups: Iterable[str], quotas: QuotaTable | None = None,
                  share_mechanisms: Mapping[str, str] | None = None
                  ) -> list[dict[str, Any]]:
    """What the form shows per profile: its resources in one line, availability now, quota and
    group permission.

    Returns:
        one dict per profile: slug, display_name, description, bundle (the one-line summary of
        :func:`resources_line`), default, available (bool: may be picked now), free (bool:
        free capacity exists now; the card is green only then), reason (why not available,
        else ""), never (bool: cannot start on this hub even when idle; the form hides such
        cards unless ``show_unavailable_profiles``), availability ("3 of 8 A100 free now" for
        GPU profiles, else ""), queued (int: servers waiting for this profile; 0 here),
        queue (bool: a spawn of it waits in the queue when it cannot start now), waits
        (bool: a spawn now would wait in the queue; the card stays selectable), image_option
        (the profile's :class:`~gpuspawner.hub.images.ImageOption`, or None).
        share (what a GPU share gives and what holds it, :func:`share_line`; "" for
        none). ``quotas``: the user's own quota table (``group_overrides``), None = the
        ledger's. ``share_mechanisms``: node name -> its share mechanism, for ``share``.
    """
    groups = list(groups)
    left = ledger.quota_remaining(user, groups, quotas)
    nodes = ledger.nodes
    cards = []
    for p in profiles:
        b = p.bundle
        card: dict[str, Any] = {"slug": p.slug, "display_name": p.display_name,
                                "description": p.description,
                                "bundle": resources_line(b, nodes), "default": p.default,
                                "available": True, "free": False, "reason": "",
                                "never": False, "availability": "", "queued": 0,
                                "image_option": p.image_option,
                                "queue": p.queue, "waits": False,
                                "share": share_line(p, nodes, share_mechanisms)}
        never = never_reason(p, nodes)
        if b.total_gpu_milli:
            free, total = ledger.free_gpus(b.gpu_models, p.nodes, b.mig)
            models = f"MIG {b.mig}" if b.mig else "/".join(b.gpu_models) or "GPU"
            if total:
                card["availability"] = f"{free} of {plural(total, models, models)} free now"
        if never:
            card.update(available=False, never=True, reason=never, availability="")
        elif not p.allowed_for(groups):
            card.update(available=False, reason="not available to your group")
        else:
            for key, need in (("gpu_milli", b.total_gpu_milli), ("cores", b.cores),
                              ("memory_bytes", b.memory_bytes), ("disk_bytes", b.disk_bytes),
                              ("servers", 1)):
                if left.get(key) is not None and need > left[key]:
                    card.update(available=False, reason=f"over your quota ({_QUOTA_WORDS[key]})")
                    break
            else:
                # the ledger's answer, for this user (one user's shares per GPU under MPS)
                if ledger.fits_now(b, p.nodes, ledger.share_user(b, user)) is not None:
                    card["free"] = True
                elif p.queue:  # fits the capacity (not "never"): it waits for its turn
                    busy = f"all {models} busy now" if b.total_gpu_milli else "no room now"
                    then = ("you will wait in the queue while a node is started"
                            if _startable(ledger, b, p.nodes) else "you will wait in the queue")
                    card.update(waits=True, reason=f"{busy}: {then}")
                elif b.gpus and ledger.free_gpus(b.gpu_models, p.nodes)[0] < b.gpus:
                    free = ledger.free_gpus(b.gpu_models, p.nodes)[0]
                    card.update(available=False, reason=f"only {free} {models} free now")
                else:
                    card.update(available=False, reason="no room on the hub now")
        cards.append(card)
    return cards


_QUOTA_WORDS = {"gpu_milli": "GPUs", "cores": "cores", "memory_bytes": "memory",
                "disk_bytes": "disk", "servers": "servers"}


def quota_line(ledger: Ledger, user: str, groups: Iterable[str],
               quotas: QuotaTable | None = None) -> str:
    """"you use 1 of your 2 GPUs" when the user has a GPU quota on a hub that has GPUs, else ""
    (a GPU quota means nothing on a hub without GPUs). ``quotas``: the user's own quota
    table (``group_overrides``), None = the ledger's."""
    groups = list(groups)
    if not ledger.gpu_milli_capacity():
        return ""
    usage = ledger.usage(user)
    left = ledger.quota_remaining(user, groups, quotas)
    if left.get("gpu_milli") is None:
        return ""
    total = (usage.gpu_milli + left["gpu_milli"]) / GPU_MILLI
    return f"you use {usage.gpu_milli / GPU_MILLI:g} of your {plural(total, 'GPU')}"


def render_form(template_name: str, extra_paths: Sequence[str], **context: Any) -> str:
    """Render ``template_name``, looked up in ``extra_paths`` first, then in the package."""
    loaders: list[Any] = [FileSystemLoader(p) for p in extra_paths]
    loaders.append(PackageLoader("gpuspawner.hub", "templates"))
    env = Environment(loader=ChoiceLoader(loaders), autoescape=select_autoescape(["html", "j2"]))
    return env.get_template(template_name).render(**context)


class OptionsFormMixin(HasTraits):
    """The spawn form of :class:`~gpuspawner.hub.spawner.GPUSpawner`: profile cards with live
    availability, ``options_from_form``, an early ``apply_user_options`` check and the undo of
    a refused spawn (``apply_group_overrides``). Expects the spawner's ``profiles``,
    ``quotas``, ``cluster``, ``user``, ``user_options_max_bytes`` and ``_options_refusal``.

    A ``HasTraits`` mixin, not a ``Configurable`` (as
    :class:`~gpuspawner.hub.settings.SpawnerSettings`): its options are ``c.GPUSpawner.*``
    only, with no section of their own in ``jupyterhub --generate-config``.
    """

    profile_form_template = Unicode(
        "profiles.html.j2",
        help="Jinja2 template name of the spawn form (see additional_template_paths).",
    ).tag(config=True)

    additional_template_paths = List(
        Unicode(),
        help="Directories searched before the built-in templates (override the form).",
    ).tag(config=True)

    show_unavailable_profiles = Bool(
        False,
        help="""Show the profiles that can never start on this hub (no GPU of their model, no
        node large enough) as greyed-out cards with the reason; by default the form hides them
        so users see only what can start.""",
    ).tag(config=True)

    @default("options_form")
    def _default_options_form(self) -> str:
        return ""  # get_options_form renders the profile cards

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        def apply_user_options(spawner: Any, user_options: dict[str, Any]) -> None:
            """Validate early (JupyterHub runs this before start and answers 400 for an
            HTTPError); start() checks again against the current configuration. A refusal
            the user_options guard recorded before storage is raised here."""
            spawner.raise_options_refusal()
            spawner.chosen_profile()
        return apply_user_options

    @default("options_from_form")
    def _default_options_from_form(self) -> Any:
        def options_from_form(formdata: dict[str, list[str]]) -> dict[str, Any]:
            values = formdata.get("profile") or []
            out: dict[str, Any] = {"profile": values[0]} if values else {}
            if values:  # the chosen card's image fields (KubeSpawner's names)
                field = f"profile-option-{values[0]}--image"
                key = (formdata.get(field) or [""])[0]
                text = (formdata.get(f"{field}--unlisted-choice") or [""])[0].strip()
                if text and key in ("", "--unlisted-choice"):
                    out["image--unlisted-choice"] = text
                elif key and key != "--unlisted-choice":
                    out["image"] = key
            if (formdata.get("fail_now") or [""])[0] in ("on", "true", "1"):
                out["queue"] = False  # "Do not wait": fail at once when busy
            return out
        return options_from_form

    @property
    def group_names(self) -> list[str]:
        """Names of the user's JupyterHub groups."""
        return sorted(g.name for g in getattr(getattr(self, "user", None), "groups", []) or [])

    async def apply_group_overrides(self) -> None:
        """JupyterHub's first spawner call of a spawn (``User.spawn``, before
        ``apply_user_options``): from here a refused spawn leaves no record it made and no
        options it brought (:func:`gpuspawner.hub.user_options.watch_spawn`)."""
        watch_spawn(self)
        await super().apply_group_overrides()  # type: ignore[misc]

    def raise_options_refusal(self) -> None:
        """Raise the HTTP 400 recorded when refused ``user_options`` were kept out of the
        database (gpuspawner.hub.user_options) or out of this spawner."""
        refused = pending_refusal(getattr(self, "orm_spawner", None)) or self._options_refusal
        self._options_refusal = None
        if refused is not None:
            raise refused

    def server_request(self) -> ServerRequest:
        """This spawn's checked request (:mod:`gpuspawner.hub.request`: the ``user_options``
        against their schema, the profiles and the user's groups), parsed once for the
        spawn (:func:`~gpuspawner.hub.request.checked_request`). Raises web.HTTPError 400
        (bad options, the field named) or 500 (bad profile configuration)."""
        try:
            return checked_request(
                self.user_options, self.load_profile_list(), self.group_names,
                self.user_options_max_bytes,  # type: ignore[attr-defined]
                check_deny_patterns(self.image_deny_patterns),  # type: ignore[attr-defined]
                check_allowed_registries(self.allowed_registries))  # type: ignore[attr-defined]
        except (ProfileConfigError, ImageOptionError) as e:
            raise web.HTTPError(500, f"profile configuration: {e}") from None
        except OptionsError as e:
            raise web.HTTPError(400, str(e)) from None

    def chosen_profile(self) -> Profile:
        """The profile of :meth:`server_request`. Raises as that."""
        return self.server_request().profile

    def request_quotas(self) -> QuotaTable | None:
        """The quota table of this user's requests: the spawner's ``quotas`` as JupyterHub's
        ``group_overrides`` left them, when they differ from the table the hub's ledger was
        made with (then they replace it for this user's checks: a per-user difference is an
        input of the request, not a second ledger); None = the ledger's. Raises
        web.HTTPError(500) for an override that is not a valid quota table (the field
        named)."""
        try:
            table = quota_table(self.quotas)  # type: ignore[attr-defined]
        except ValueError as e:
            raise web.HTTPError(500, f"GPUSpawner.{e} (group_overrides)") from None
        return None if table == self.cluster.ledger.quotas else table  # type: ignore

    def load_profile_list(self) -> list[Profile]:
        """The validated profiles. Raises ProfileConfigError for bad configuration."""
        return load_profiles(self.profiles)  # type: ignore[attr-defined]

    def profile_cards(self) -> list[dict[str, Any]]:
        """The form's cards for this user (:func:`profile_cards`)."""
        cluster: Any = self.cluster  # type: ignore[attr-defined]
        runtimes = getattr(cluster, "nodes", None) or {}
        mechanisms = {name: rt.gpu_share.name for name, rt in runtimes.items()
                      if getattr(rt, "gpu_share", None) is not None}
        return profile_cards(self.load_profile_list(), cluster.ledger,
                             self.user.name, self.group_names,  # type: ignore[attr-defined]
                             self.request_quotas(), mechanisms)

    def preselected_profile(self) -> str:
        """The slug the form checks first: the profile of this server's last ``user_options``
        (a refused spawn comes back to the form with the same choice), "" for none. A URL
        fragment ``#profile=<slug>`` overrides it in the browser (the template's script); a
        query argument cannot, as JupyterHub spawns at once for any query argument of
        ``/hub/spawn`` (``SpawnHandler.get``)."""
        options = getattr(self, "user_options", None) or {}
        slug = options.get("profile") if isinstance(options, dict) else None
        return slug if isinstance(slug, str) else ""

    def queued_counts(self) -> dict[str, int]:
        """Servers waiting per profile slug in the wait queue, shown on each card as "N
        waiting"."""
        queue = self.cluster.queue  # type: ignore[attr-defined]
        return queue.wq.count_by_profile() if queue is not None else {}

    async def budget_texts(self) -> list[str]:
        """The spawn form's lines about the user's usage budgets at or past 80 % (or used up:
        :func:`gpuspawner.usage.budgets.warning_text`); none without budgets or for a
        holder of ``custom:gpuspawner:budget-exempt``."""
        s: Any = self
        cluster = s.cluster
        policy = getattr(cluster, "usage_budgets", None)
        recorder = getattr(cluster, "usage", None)
        if not policy or recorder is None:
            return []
        if EXEMPT_SCOPE in getattr(s, "user_scopes", set)():
            return []
        status = await asyncio.to_thread(budget_status, recorder.store, policy, s.user.name,
                                         list(s.group_names))
        return [t for t in map(warning_text, status) if t]

    async def get_options_form(self) -> str:
        """The spawn form: profile cards with live availability (Jinja2 template), unless the
        admin configured ``options_form`` themselves. Cards that can never start here are
        left out unless ``show_unavailable_profiles``."""
        if self.options_form:  # type: ignore[attr-defined]
            return await super().get_options_form()  # type: ignore[misc]
        s: Any = self
        await s.cluster.ensure_restored(s._owner_exists)
        cards = [c for c in self.profile_cards()
                 if self.show_unavailable_profiles or not c["never"]]
        queued = self.queued_counts()
        for c in cards:
            c["queued"] = queued.get(c["slug"], c["queued"])
        return render_form(self.profile_form_template, self.additional_template_paths,
                           cards=cards, spawner=self, selected=self.preselected_profile(),
                           quota_text=quota_line(s.cluster.ledger, s.user.name,
                                                 s.group_names, self.request_quotas()),
                           budget_texts=await self.budget_texts())
