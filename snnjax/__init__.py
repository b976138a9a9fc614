"""snnjax: spiking neural networks in JAX.

``snnjax.neurons`` is imported first: the kernel packages (``snnjax.pallas``, ``snnjax.native``)
import ``snnjax.neurons.base``, and ``snnjax.neurons.dispatch`` imports them, so the neurons
package must be initialised before either kernel package, whichever a program imports first.
"""
from snnjax import neurons  # noqa: F401
