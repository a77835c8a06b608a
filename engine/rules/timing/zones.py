"""IANA zone keys: which names are zones, and the ZoneInfo of a key."""

from __future__ import annotations

import re
from functools import lru_cache
from zoneinfo import ZoneInfo, available_timezones

from schemas.errors import InvalidInput

_ZONE_KEY = re.compile(r"^[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*$")
# Files in the zone directory that are not zones: "localtime" is whatever the
# host is set to, "Factory" means "zone not configured".
_NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})


@lru_cache(maxsize=1)
def zone_keys() -> frozenset[str]:
    return frozenset(available_timezones()) - _NOT_ZONES


def validate_zone(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput("time_zone", f"must be an IANA zone name, got {type(value).__name__}", "Europe/Berlin")
    key = value.strip()
    if not key:
        raise InvalidInput("time_zone", "is empty; give an IANA zone name", "Europe/Berlin")
    # Checked before any lookup so that "../etc/passwd" never reaches the file system.
    if len(key) > 64 or not _ZONE_KEY.match(key):
        raise InvalidInput("time_zone", f"{key[:64]!r} is not an IANA zone name", "America/New_York")
    if key not in zone_keys():
        folded = {k.lower(): k for k in zone_keys()}
        hint = f"; did you mean {folded[key.lower()]!r}?" if key.lower() in folded else ""
        raise InvalidInput("time_zone", f"{key!r} is not a known IANA zone{hint}", "America/New_York")
    return key


@lru_cache(maxsize=1024)
def zone_info(key: str) -> ZoneInfo:
    """The ZoneInfo of a key (memoized); a key that is not a zone raises InvalidInput("time_zone")."""
    if key not in zone_keys():  # specs can be built without build_time_spec (e.g. from a database row)
        validate_zone(key)
    return ZoneInfo(key)
