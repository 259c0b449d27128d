"""kvhandoff package."""
