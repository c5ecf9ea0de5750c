"""What AWS calls a region where it does not use the code: the Price List names a region by its
location (its `location` attribute). A leaf, so the product's price reader and the local cloud's
Price List serve the same names from one table."""

from __future__ import annotations

LOCATIONS = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
    "eu-central-1": "EU (Frankfurt)",
}
