// Chart.js with the parts the console's charts use registered once (bars and lines on linear and category
// scales, with tooltips and legends): the rest of the library is left out of the bundle.

import {
  BarController,
  BarElement,
  CategoryScale,
  Chart,
  Legend,
  LinearScale,
  LineController,
  LineElement,
  PointElement,
  Tooltip,
} from 'chart.js';

Chart.register(BarController, BarElement, CategoryScale, LinearScale, LineController, LineElement, PointElement, Tooltip, Legend);

export { Chart };
